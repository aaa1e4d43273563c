"""The CPU overhead benchmarks in their quick mode (MPS simulator, fake GPUs): they run, write
their JSON, and the report renders it. Timings are recorded, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional
REPO = Path(__file__).resolve().parents[2]
EXPECTED = {
    *(f"overhead/sim/prolog/gpus{g}" for g in (1, 2, 4, 8)),
    "overhead/sim/supervisor",
    "overhead/sim/epilog/clients0",
    "overhead/sim/epilog/clients12",
}


@pytest.mark.timeout(600)
def test_quick_overhead_benchmarks_write_json_and_render(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    run = [sys.executable, str(REPO / "benchmarks" / "run.py"), "--quick", "--out", str(out)]
    res = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=540)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    runs = {r["key"]: r for r in data["runs"]}
    assert set(runs) == EXPECTED
    assert all(r["simulated"] for r in runs.values())
    for r in runs.values():
        for measure in ("prolog", "epilog_no_clients", "epilog", "status", "start"):
            if measure in r:
                assert 0 < r[measure]["min_ms"] <= r[measure]["median_ms"] <= r[measure]["max_ms"]
    assert runs["overhead/sim/supervisor"]["rss_mib"] > 0
    assert runs["overhead/sim/supervisor"]["guard_uss_mib"] is not None, "no guard measured"
    report = [sys.executable, str(REPO / "benchmarks" / "report.py"), str(out)]
    shown = subprocess.run(report, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "| sim/supervisor | start |" in shown and "| sim/epilog/clients12 | epilog |" in shown
