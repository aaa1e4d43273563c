"""Issue-18 gpu tier: ``mpswrap farm`` with the real MPS: each task a client of the GPU's
daemon, the tasks a real fatal fault ended retried, and a SIGTERM that leaves nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from .conftest import leftovers

pytestmark = pytest.mark.gpu
CLIENT = os.environ.get("MPS_CONTRACT_CLIENT", "cuda_client")


def _env(root: Path) -> dict[str, str]:
    return dict(
        os.environ, MPSWRAP_USER_RUN_DIR=str(root / "run"), MPSWRAP_RUN_DIR=str(root / "run")
    )


def _state(farm_dir: Path) -> list[dict[str, object]]:
    path = farm_dir / "state.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def test_a_real_fault_is_retried_and_every_task_is_a_client(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    mark, farm_dir = shared_tmp / "faulted-once", shared_tmp / "farm"
    lines = [f"{CLIENT} --seconds 3" for _ in range(12)]
    lines[5] = (
        f"if [ -e {mark} ]; then exec {CLIENT} --seconds 2; else touch {mark}; "
        f"exec {CLIENT} --seconds 30 --fault-after 1.5; fi"
    )
    tasks = shared_tmp / "tasks.txt"
    tasks.write_text("\n".join(lines) + "\n")
    argv = [
        sys.executable,
        "-m",
        "mpswrap",
        "farm",
        "--per-gpu",
        "4",
        "--verify-attach",
        "fail",
        "--progress",
        "lines",
        "--dir",
        str(farm_dir),
        str(tasks),
    ]
    res = subprocess.run(argv, env=_env(shared_tmp), text=True, capture_output=True, timeout=300)
    print(res.stdout, res.stderr)
    assert res.returncode == 0, res.stderr
    attempts = _state(farm_dir)
    faulted = [r for r in attempts if r["status"] == "fault"]
    print(json.dumps(attempts, indent=1))
    assert 5 in {r["task"] for r in faulted}
    for record in faulted:  # each retried once, and done
        again = [r for r in attempts if r["task"] == record["task"] and r["attempt"] == 2]
        assert [r["status"] for r in again] == ["done"]
    assert {r["task"] for r in attempts if r["status"] == "done"} == set(range(12))
    # The first attempt's log (the second's is 0005-<id>.2.out): glob's order is the disk's.
    (first,) = [p for p in (farm_dir / "logs").glob("0005-*.out") if p.name.count(".") == 1]
    assert "CUDA error 700" in first.read_text()
    assert "not an MPS client" not in res.stderr
    assert leftovers(shared_tmp, mps_baseline) == []


def test_sigterm_mid_farm_ends_tasks_through_terminate_client_and_leaves_nothing(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    tasks = shared_tmp / "tasks.txt"
    tasks.write_text("".join(f"{CLIENT} --seconds 60\n" for _ in range(8)))
    farm_dir = shared_tmp / "farm"
    argv = [
        sys.executable,
        "-m",
        "mpswrap",
        "farm",
        "--per-gpu",
        "4",
        "--dir",
        str(farm_dir),
        str(tasks),
    ]
    proc = subprocess.Popen(
        argv,
        env=_env(shared_tmp),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while sum("started" in p.read_text() for p in farm_dir.glob("logs/*.out")) < 4:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    t0 = time.monotonic()
    for member in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
        try:
            member.send_signal(signal.SIGTERM)  # as scancel signals a step: all at once
        except psutil.Error:
            pass
    out, err = proc.communicate(timeout=120)
    print(f"ended in {time.monotonic() - t0:.2f} s", out, err)
    assert proc.returncode == 128 + signal.SIGTERM, err
    started = [
        o for p in sorted((farm_dir / "logs").glob("*.out")) if "started" in (o := p.read_text())
    ]
    # Each client saw CUDA_ERROR_MPS_CLIENT_TERMINATED (810): terminate_client, not a signal.
    assert len(started) == 4 and all("CUDA error 810" in o for o in started), started
    assert _state(farm_dir) == []
    assert leftovers(shared_tmp, mps_baseline) == []
