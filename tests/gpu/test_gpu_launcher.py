"""Issue-4 gpu tier: `mpswrap mpirun -np 12` with the small-MLP worker, against raw MPS
started by hand in the same run (a daemon per GPU, each worker on the GPU mpswrap would give
it: benchmarks/run.py); then SIGTERM to the whole process tree mid-run. On every GPU of the
machine (issue 43)."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.placed import placed
from tests.procs import ended, signal_tree
from tests.tree import REPO

from .conftest import leftovers, machine_gpus

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(REPO / "benchmarks"))
#: Runs per mode in the ratio test; its bound applies to the medians.
ROUNDS = 3


def _run_mpirun(n: int, steps: int, tmp: Path) -> float:
    """Wall time of `mpswrap mpirun -np n` running the MLP worker (go-file barrier)."""
    (tmp / "ready").mkdir(parents=True, exist_ok=True)
    worker = [
        sys.executable,
        str(REPO / "benchmarks" / "workers" / "mlp.py"),
        "--steps",
        str(steps),
        "--ready",
        str(tmp / "ready"),
        "--go",
        str(tmp / "go"),
    ]
    env = dict(os.environ, MPSWRAP_USER_RUN_DIR=str(tmp / "run"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mpswrap",
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            str(n),
            *worker,
        ],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 180
    while len(os.listdir(tmp / "ready")) < n:
        if proc.poll() is not None:  # the whole standard error: an assertion's would be cut
            out, err = proc.communicate()
            pytest.fail(
                f"mpirun exited {proc.returncode} before its ranks were ready:\n{err}\n{out}"
            )
        assert time.monotonic() < deadline, "workers not ready"
        time.sleep(0.05)
    smi = subprocess.run(["nvidia-smi"], text=True, capture_output=True).stdout
    t_go = time.time()
    (tmp / "go").touch()
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    ends: list[float] = [
        json.loads(ln[ln.index("{") :])["end"] for ln in out.splitlines() if '"end"' in ln
    ]
    assert len(ends) == n, out
    print(smi)
    assert smi.count(" M+C ") == n, smi
    return max(ends) - t_go


def _spread(runs: list[float]) -> str:
    median = statistics.median(runs)
    each = ", ".join(f"{w:.3f}" for w in runs)
    return f"median {median:.3f} s ({each}; spread {(max(runs) - min(runs)) / median:.0%})"


@pytest.mark.timeout(400)  # 6 runs of ~20 s each, torch start included
def test_mpirun_12_mlp_ranks_match_raw_mps(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    from run import run_once

    steps = 4000  # ~5 s of work under MPS at N=12, against a run-to-run spread of about 20%
    walls: dict[str, list[float]] = {"raw": [], "mpswrap": []}
    for i in range(ROUNDS):  # interleaved, the order swapped each round: drift hits both alike
        for mode in ("raw", "mpswrap") if i % 2 == 0 else ("mpswrap", "raw"):
            if mode == "raw":
                walls[mode].append(run_once("mlp", "rawmps", 12, steps)["wall_s"])
            else:
                walls[mode].append(_run_mpirun(12, steps, shared_tmp / f"run{i}"))
    raw, wrapped = (statistics.median(walls[m]) for m in ("raw", "mpswrap"))
    rounds = [w / r for w, r in zip(walls["mpswrap"], walls["raw"], strict=False)]
    print(f"raw MPS {_spread(walls['raw'])}; mpswrap mpirun {_spread(walls['mpswrap'])}")
    print(
        f"ratio of medians {wrapped / raw:.3f}; per round {', '.join(f'{x:.3f}' for x in rounds)}"
    )
    (shared_tmp / "result.json").write_text(json.dumps(walls))
    assert wrapped <= raw * 1.05
    assert leftovers(shared_tmp, mps_baseline) == []


def test_sigterm_to_the_whole_tree_ends_every_client_through_mps(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    ready = shared_tmp / "ready"
    ready.mkdir()
    worker = [
        sys.executable,
        str(REPO / "benchmarks" / "workers" / "mlp.py"),
        "--steps",
        "1000000",
        "--ready",
        str(ready),
        "--go",
        str(shared_tmp / "go"),
    ]
    archive = shared_tmp / "logs"
    env = dict(
        os.environ,
        MPSWRAP_USER_RUN_DIR=str(shared_tmp / "run"),
        MPSWRAP_DEBUG="1",
        MPSWRAP_LOG_ARCHIVE=str(archive),
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mpswrap",
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "12",
            *worker,
        ],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    with ended(proc):  # a failed assertion before the signal leaves no run behind
        deadline = time.monotonic() + 180
        while len(os.listdir(ready)) < 12:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        (shared_tmp / "go").touch()
        time.sleep(3)
        # One daemon, so one server and its log, per GPU the 12 ranks are on (by block).
        logs = list((shared_tmp / "run").rglob("server.log"))
        assert len(logs) == len(set(placed("block", 12, machine_gpus()))), logs
        signal_tree(proc, signal.SIGTERM)  # like scancel: every process of the step at once
        out = proc.communicate(timeout=120)[0]
    left = leftovers(shared_tmp, mps_baseline)  # waits for the daemons to stop (log archived)
    log_copy = "".join(p.read_text() for p in archive.glob("*-server.log"))
    print(out[-4000:])
    print(log_copy[-3000:])
    assert proc.returncode == 143, proc.returncode
    assert log_copy.count("Client termination succeeded") == 12
    assert "fatal" not in log_copy.lower()
    assert left == []
