"""``mpswrap farm status --plot FILE DIR`` on the simulator: K per GPU and throughput over time
from the ``packing`` history of the farm's status record.

The farm is real (simulated clients, 2 at a time); its record's ``packing`` is forged by a
driver that wraps ``farm.status.status_json``, so the plot is drawn from a known history
whatever the farm engine records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.simenv import SimNode

pytestmark = pytest.mark.functional

PNG = b"\x89PNG\r\n\x1a\n"
#: Runs mpswrap's command line with the status record's ``packing`` replaced by
#: $FORGED_PACKING, and matplotlib hidden where $HIDE_MATPLOTLIB is set.
DRIVER = """
import json, os, sys
if os.environ.get("HIDE_MATPLOTLIB"):
    sys.modules["matplotlib"] = None
from mpswrap.taskfarm import status as farmstatus
from mpswrap.cli.main import main
real = farmstatus.status_json
forged = json.loads(os.environ["FORGED_PACKING"])
farmstatus.status_json = lambda *args: {**real(*args), "packing": forged}
sys.exit(main(sys.argv[1:]))
"""


def _history(t0: float, ks: list[int]) -> list[dict[str, object]]:
    return [
        {"t": t0 + 5 * i, "k": k, "throughput": None if i == 0 else 0.5 * k, "why": "raise"}
        for i, k in enumerate(ks)
    ]


def _status(
    node: SimNode, farm_dir: Path, packing: object, *options: str, **extra: str
) -> subprocess.CompletedProcess[str]:
    env = node.env(FORGED_PACKING=json.dumps(packing), PATH=os.environ["PATH"], **extra)
    argv = [sys.executable, "-c", DRIVER, "farm", "status", *options, str(farm_dir)]
    return subprocess.run(argv, env=env, text=True, capture_output=True, timeout=60)


@pytest.fixture
def farm_dir(node: SimNode) -> Path:
    """A finished farm of 4 simulated tasks, 2 at a time on each GPU."""
    tasks = node.root / "tasks.txt"
    tasks.write_text(f"{node.client} --seconds 0.2\n" * 4)
    farm = node.root / "farm"
    res = node.run("farm", "--per-gpu", "2", "--progress", "off", "--dir", str(farm), str(tasks))
    assert res.returncode == 0, res.stderr
    return farm


def test_farm_status_plot_draws_each_gpus_k_history(node: SimNode, farm_dir: Path) -> None:
    png = node.root / "packing.png"
    packing = {
        "GPU-forged-0": {"k": 8, "history": _history(1.0e9, [2, 4, 8, 6])},
        "GPU-forged-1": {"k": 4, "history": _history(1.0e9 + 1, [2, 4])},
    }
    res = _status(node, farm_dir, packing, "--plot", str(png))
    assert res.returncode == 0, res.stderr
    assert png.read_bytes()[:8] == PNG
    assert f"farm status: plot saved to {png}" in res.stdout
    assert "done" in res.stdout, "the status lines are printed as without --plot"
    # With --json the JSON alone is on stdout, the plot's line on stderr.
    res = _status(node, farm_dir, packing, "--json", "--plot", str(png))
    assert res.returncode == 0 and json.loads(res.stdout)["packing"] == packing, res.stderr


def test_farm_status_plot_refuses_a_record_without_k_history_and_without_matplotlib(
    node: SimNode, farm_dir: Path
) -> None:
    png = node.root / "packing.png"
    res = _status(node, farm_dir, {}, "--plot", str(png))
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("mpswrap: farm status --plot: the farm's record has no K history")
    assert "Traceback" not in res.stderr and not png.exists()
    packing = {"GPU-forged-0": {"k": 2, "history": _history(1.0e9, [2])}}
    res = _status(node, farm_dir, packing, "--plot", str(png), HIDE_MATPLOTLIB="1")
    assert res.returncode == 2 and "mpswrap: --plot needs matplotlib" in res.stderr, res.stderr
    assert res.stdout == "" and not png.exists(), "refused before anything is printed"
    res = node.run("farm", "--plot", str(png), str(node.root / "tasks.txt"))
    assert res.returncode == 2 and "unknown option '--plot'" in res.stderr, res.stderr
