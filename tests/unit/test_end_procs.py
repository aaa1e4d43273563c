"""``_wait.end_procs``, the one "end a process" tail: a signal, a grace, SIGKILL, a bounded
wait; our own children reaped, descendants killed where asked. Real short-lived processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from mpswrap import _proc, _wait
from tests.waits import wait_until

#: A process that sleeps long enough that only a signal ends it within a test.
SLEEPER = "import time; time.sleep(120)"
#: One that starts a grandchild like itself (both inherit its ignored SIGTERM) and sleeps.
PARENT = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); {SLEEPER}"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """What a test spawns: killed and reaped at the end, whatever the test did."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _spawn(
    started: list[subprocess.Popen[str]], code: str = SLEEPER, *, shielded: bool = False
) -> subprocess.Popen[str]:
    """``code`` under this Python; ``shielded``: SIGTERM ignored from before its exec on, so
    no signal can come before the program is ready for it."""
    ignore = (signal.SIGTERM,) if shielded else ()
    proc = _proc.spawn([sys.executable, "-c", code], env=dict(os.environ), ignore_signals=ignore)
    started.append(proc)
    return proc


def _reaped(proc: subprocess.Popen[str]) -> bool:
    """``end_procs`` reaped it: its returncode is set, and no zombie of it is left to wait
    for (the test never calls ``poll`` itself, which would reap it too)."""
    try:
        os.waitpid(proc.pid, os.WNOHANG)
    except ChildProcessError:
        return proc.returncode is not None
    return False


def test_one_that_exits_on_sigterm_is_gone_without_sigkill(
    started: list[subprocess.Popen[str]],
) -> None:
    proc = _spawn(started)
    seen: list[list[_proc.ProcId]] = []

    def note(survivors: list[_proc.ProcId]) -> list[_proc.ProcId]:
        seen.append(survivors)
        return survivors

    t0 = time.monotonic()
    left = _wait.end_procs([], grace=60, children=[proc], before_kill=note)
    took = time.monotonic() - t0
    assert left == []
    assert seen == [[]], "nothing outlived the grace: nothing to kill"
    assert _reaped(proc)
    assert proc.returncode == -signal.SIGTERM
    assert took < 30, f"waited {took:.1f} s for a process that ends on SIGTERM at once"


def test_one_that_ignores_sigterm_is_sigkilled_after_the_grace(
    started: list[subprocess.Popen[str]],
) -> None:
    proc = _spawn(started, shielded=True)
    ident = _proc.identify(proc.pid)
    assert ident is not None
    t0 = time.monotonic()
    left = _wait.end_procs([ident], grace=0.3)  # by identity: not reaped here, gone all the same
    took = time.monotonic() - t0
    assert left == []
    assert not _proc.is_alive(ident)
    assert _wait.wait_child(proc, 30) == -signal.SIGKILL
    assert took >= 0.3, "SIGKILLed before the grace was over"


def test_a_child_is_reaped(started: list[subprocess.Popen[str]]) -> None:
    proc = _spawn(started, shielded=True)
    assert _wait.end_procs([], grace=0.1, children=[proc]) == []
    assert _reaped(proc)
    assert proc.returncode == -signal.SIGKILL


def test_sigkill_needs_no_grace(started: list[subprocess.Popen[str]]) -> None:
    proc = _spawn(started, shielded=True)
    t0 = time.monotonic()
    assert _wait.end_procs([], signal.SIGKILL, grace=60, children=[proc]) == []
    took = time.monotonic() - t0
    assert _reaped(proc)
    assert proc.returncode == -signal.SIGKILL
    assert took < 30, f"waited {took:.1f} s: the grace is not for SIGKILL"


def test_no_signal_only_waits_for_what_was_asked_another_way(
    started: list[subprocess.Popen[str]],
) -> None:
    quits = _spawn(started, "raise SystemExit(3)")
    assert _wait.end_procs([], None, grace=60, children=[quits]) == []
    assert _reaped(quits)
    assert quits.returncode == 3


def test_before_kill_chooses_what_is_killed(started: list[subprocess.Popen[str]]) -> None:
    kept, killed = _spawn(started, shielded=True), _spawn(started, shielded=True)
    seen: list[_proc.ProcId] = []

    def only_one(survivors: list[_proc.ProcId]) -> list[_proc.ProcId]:
        seen.extend(survivors)
        return [p for p in survivors if p.pid == killed.pid]

    left = _wait.end_procs([], grace=0.2, children=[kept, killed], before_kill=only_one)
    assert sorted(p.pid for p in seen) == sorted([kept.pid, killed.pid]), "both ignored SIGTERM"
    assert left == [], "what before_kill left out is not to be ended"
    assert kept.poll() is None, "it was never SIGKILLed"
    assert killed.returncode == -signal.SIGKILL


@pytest.mark.parametrize("tree", [True, False])
def test_tree_kills_a_grandchild(started: list[subprocess.Popen[str]], tree: bool) -> None:
    parent = _spawn(started, PARENT, shielded=True)
    found = wait_until(lambda: _proc.children_of(parent.pid), 60, "the grandchild to start")
    grandchild = found[0]
    try:
        left = _wait.end_procs([], grace=0.2, children=[parent], tree=tree)
        assert parent.returncode == -signal.SIGKILL
        if tree:
            assert left == []
            assert not _proc.is_alive(grandchild)
        else:  # the control: without tree the grandchild outlives its parent
            assert _proc.is_alive(grandchild)
    finally:
        _proc.kill_procs([grandchild], signal.SIGKILL)
        assert _wait.wait_gone([grandchild], 30) == []
