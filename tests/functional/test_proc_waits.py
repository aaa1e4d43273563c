"""_proc's waits: woken by the exit itself (pidfd), or polling where there is none; bounded.
And ``_proc.run``'s wait for a program that dies before reading its input."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpswrap import _proc, _wait
from mpswrap.errors import ProcError
from tests.waits import wait_until

pytestmark = pytest.mark.functional


def _sleeper(seconds: float) -> subprocess.Popen[str]:
    code = f"import time; time.sleep({seconds})"
    return subprocess.Popen([sys.executable, "-c", code], text=True)


@pytest.fixture(params=["pidfd", "polling"])
def waits(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "polling":
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    elif not hasattr(os, "pidfd_open"):
        pytest.skip("no os.pidfd_open here")
    return str(request.param)


def test_wait_gone_returns_when_the_processes_exit(waits: str) -> None:
    procs = [_sleeper(0.2), _sleeper(0.4)]
    ids = [_proc.identify(p.pid) for p in procs]
    t0 = time.monotonic()
    left = _wait.wait_gone([i for i in ids if i], timeout=30)
    took = time.monotonic() - t0
    for p in procs:
        p.wait()
    assert left == []
    assert took < 15, f"{waits}: waited {took:.1f} s for processes that ended after 0.4 s"


def test_wait_gone_returns_those_still_alive_at_the_deadline(waits: str) -> None:
    busy, done = _sleeper(30), _sleeper(0)
    ids = [_proc.identify(busy.pid), _proc.identify(done.pid)]
    try:
        left = _wait.wait_gone([i for i in ids if i], timeout=0.5)
        assert left == [ids[0]]
    finally:
        busy.kill()
        busy.wait()
        done.wait()


def test_wait_gone_ignores_a_pid_with_another_start_time() -> None:
    proc = _sleeper(30)
    try:
        stale = _proc.ProcId(proc.pid, 12345.0)  # the same PID, another process
        assert _wait.wait_gone([stale], timeout=30) == []
    finally:
        proc.kill()
        proc.wait()


def test_wait_child_returns_the_exit_code_or_times_out(waits: str) -> None:
    quick = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], text=True)
    assert _wait.wait_child(quick, timeout=30) == 3
    slow = _sleeper(30)
    try:
        assert _wait.wait_child(slow, timeout=0.3) is None  # still running: no exception
        assert slow.poll() is None
    finally:
        slow.kill()
        slow.wait()


def test_run_returns_the_exit_of_a_program_that_never_read_its_input() -> None:
    """A control program killed before it read its command (Slurm signals a whole step) is
    an exit status, not a broken pipe: the input fills the pipe until the reader is gone."""
    res = _proc.run(["sh", "-c", "exit 3"], env={}, timeout=30, input="x" * (1 << 20), limit=4096)
    assert res.returncode == 3


@pytest.mark.parametrize("limit", [None, 4096])
def test_run_past_its_timeout_ends_even_where_a_process_that_left_its_session_holds_the_pipes(
    tmp_path: Path, limit: int | None
) -> None:
    """The program is killed with its process group; a descendant that left the group (its
    own session) still holds stdout, and is not waited for: the timeout stays a bound."""
    pid_file = tmp_path / "escaped.pid"
    script = f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 60' & echo started; sleep 60"
    started = time.monotonic()
    try:
        with pytest.raises(ProcError) as raised:
            _proc.run(["sh", "-c", script], env={"PATH": _proc.SAFE_PATH}, timeout=1, limit=limit)
        took = time.monotonic() - started
        assert raised.value.cause == "no answer in 1 s"
        assert took < 1 + _proc.KILLED_OUTPUT_WAIT + 10, took  # not the escaped one's 60 s
    finally:
        wait_until(pid_file.exists, 30, "the escaped process wrote its PID")
        escaped = _proc.identify(int(pid_file.read_text()))
        assert escaped is not None
        _wait.end_procs([escaped], grace=0)
