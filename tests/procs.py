"""What tests do to a run's processes from outside, as a scheduler would; and how they name
the processes a test left behind."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import psutil

__all__ = ["described", "ended", "interruptible", "signal_tree"]

P = TypeVar("P", bound="subprocess.Popen[Any]")


def signal_tree(proc: subprocess.Popen[Any], sig: int) -> int:
    """Signal every process of the run at the same moment, as scancel does to a step; how
    many there were."""
    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for member in tree:
        try:
            member.send_signal(sig)
        except psutil.Error:
            pass
    return len(tree)


def described(proc: psutil.Process) -> str | None:
    """``PID (user) command line`` of a process that still runs, for a test's report of what
    was left behind; None once it has ended. A process may end while a test looks at it: it
    is gone, or a zombie, whose command line psutil refuses (``ZombieProcess``: under load
    a harness that asked for it failed instead of reporting), or its PID is another's by now.
    None of these is a leftover."""
    try:
        if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        with proc.oneshot():
            return f"{proc.pid} ({proc.username()}) {' '.join(proc.cmdline())[:300]}"
    except psutil.NoSuchProcess:  # ZombieProcess is one: it ended while we looked
        return None
    except psutil.AccessDenied:
        return f"{proc.pid} (not readable)"


@contextmanager
def ended(proc: P, timeout: float = 120) -> Iterator[P]:
    """``proc`` for the block; after it, even after a failed assertion, a run still going
    gets SIGTERM on its whole tree (as scancel sends it), SIGKILL ``timeout`` seconds later,
    and its pipes are closed: a test that fails leaves no run behind, and no unclosed file
    (a ResourceWarning, an error under ``filterwarnings = error``). After a failure, what the
    run wrote to its pipes is printed (a test reports it with its failure)."""
    failed = True
    try:
        yield proc
        failed = False
    finally:
        if proc.poll() is None:
            with suppress(psutil.Error):
                signal_tree(proc, signal.SIGTERM)
        said: tuple[Any, Any] = (None, None)
        try:  # reading as it waits: a run blocked on a full pipe must not hold it up
            said = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with suppress(psutil.Error):
                signal_tree(proc, signal.SIGKILL)
            proc.wait(timeout=30)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:  # closed already after a whole communicate: harmless
                stream.close()
        if failed:
            for name, text in zip(("stdout", "stderr"), said, strict=True):
                print(f"--- the run's {name}, its last 3000 characters:\n{str(text)[-3000:]}")


@contextmanager
def interruptible() -> Iterator[None]:
    """Programs started inside take SIGINT as a terminal's foreground program does (its
    default action), whatever this process inherited: a shell without job control starts its
    background jobs with SIGINT ignored, and every child inherits that (the python tier run
    behind ``&`` failed exactly the tests that send SIGINT)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
