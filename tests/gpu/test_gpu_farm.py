"""Issue-18 gpu tier: ``mpswrap farm`` with the real MPS: each task a client of its GPU's
daemon, the tasks a real fatal fault ended retried, and a SIGTERM that leaves nothing. The
farm uses every GPU of the machine, K tasks on each (issue 43)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.procs import ended, signal_tree

from .conftest import leftovers, machine_gpus

pytestmark = pytest.mark.gpu
CLIENT = os.environ.get("MPS_CONTRACT_CLIENT", "cuda_client")
#: Tasks at once on each GPU (``--per-gpu``).
K = 4


def _env(root: Path) -> dict[str, str]:
    return dict(
        os.environ, MPSWRAP_USER_RUN_DIR=str(root / "run"), MPSWRAP_RUN_DIR=str(root / "run")
    )


def _state(farm_dir: Path) -> list[dict[str, object]]:
    """The farm's attempt records (its journal's events left out)."""
    path = farm_dir / "state.jsonl"
    lines = [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
    return [r for r in lines if "event" not in r]


def _farm_status(root: Path, farm_dir: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "mpswrap", "farm", "status", "--json", str(farm_dir)]
    res = subprocess.run(argv, env=_env(root), text=True, capture_output=True, timeout=30)
    assert res.returncode == 0, res.stderr
    found: dict[str, Any] = json.loads(res.stdout)
    return found


def test_farm_status_from_another_shell_mid_run(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    """``mpswrap farm status --json DIR`` from another process while real clients run 4 at a
    time on each GPU of the machine (twice as many tasks as run at once): the running tasks,
    4 on each GPU, since when, the counts and an ETA; then all done."""
    gpus = machine_gpus()
    running, tasks_n = K * len(gpus), 2 * K * len(gpus)
    tasks = shared_tmp / "tasks.txt"
    tasks.write_text("".join(f"{CLIENT} --seconds 6\n" for _ in range(tasks_n)))
    farm_dir = shared_tmp / "farm"
    argv = [sys.executable, "-m", "mpswrap", "farm", "--per-gpu", str(K), "--dir", str(farm_dir)]
    proc = subprocess.Popen(
        [*argv, str(tasks)],
        env=_env(shared_tmp),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    with ended(proc):
        deadline = time.monotonic() + 90
        status: dict[str, Any] = {}
        journal = farm_dir / "state.jsonl"
        while time.monotonic() < deadline and proc.poll() is None:
            if journal.exists() and journal.stat().st_size:  # the farm's first line is out
                status = _farm_status(shared_tmp, farm_dir)
                if status["running"] == running:
                    break
            time.sleep(0.2)
        print(json.dumps(status, indent=1))
        assert status.get("running") == running, status
        (share,) = status["shares"]
        assert share["state"] == "running" and share["tasks"] == tasks_n, share
        now = share["running_tasks"]
        assert len(now) == running and all(t["gpu"] and t["since"] for t in now), now
        assert Counter(t["gpu"] for t in now) == dict.fromkeys(gpus, K), now
        assert share["not_run"] + share["done"] + share["failed"] + running == tasks_n, share
        out, err = proc.communicate(timeout=180)
        print(out, err)
        assert proc.returncode == 0, err
    after = _farm_status(shared_tmp, farm_dir)
    print(json.dumps(after, indent=1))
    assert (after["done"], after["failed"], after["running"]) == (tasks_n, 0, 0), after
    assert leftovers(shared_tmp, mps_baseline) == []


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
    """SIGTERM to the farm's every process once 4 tasks run on each GPU of the machine (as
    many again wait): each running task ended by terminate_client, none started after."""
    running = K * len(machine_gpus())
    tasks = shared_tmp / "tasks.txt"
    tasks.write_text("".join(f"{CLIENT} --seconds 60\n" for _ in range(2 * running)))
    farm_dir = shared_tmp / "farm"
    argv = [
        sys.executable,
        "-m",
        "mpswrap",
        "farm",
        "--per-gpu",
        str(K),
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
    with ended(proc):
        deadline = time.monotonic() + 60
        while sum("started" in p.read_text() for p in farm_dir.glob("logs/*.out")) < running:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        t0 = time.monotonic()
        signal_tree(proc, signal.SIGTERM)  # as scancel signals a step: all at once
        out, err = proc.communicate(timeout=120)
    print(f"ended in {time.monotonic() - t0:.2f} s", out, err)
    assert proc.returncode == 128 + signal.SIGTERM, err
    started = [
        o for p in sorted((farm_dir / "logs").glob("*.out")) if "started" in (o := p.read_text())
    ]
    # Each client saw CUDA_ERROR_MPS_CLIENT_TERMINATED (810): terminate_client, not a signal.
    assert len(started) == running and all("CUDA error 810" in o for o in started), started
    # Recorded as interrupted (the signal ended them), never as done: they run again next time.
    assert [r["status"] for r in _state(farm_dir)] == ["interrupted"] * running, _state(farm_dir)
    assert leftovers(shared_tmp, mps_baseline) == []
