"""Waiting for processes to exit: the one place mpswrap waits.

Each wait wakes on the exit itself through a pidfd (Linux >= 5.3); where there is none it
polls, at most ``POLL_CAP`` apart. Every wait is bounded and returns what it found: nothing
here raises a foreign exception type on a timeout.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable, Iterable

from ._proc import Child, ProcId, is_alive

__all__ = ["POLL_CAP", "backoff", "pidfd", "wait_child", "wait_exit", "wait_gone"]

#: Longest sleep between two looks at a process that has no pidfd to wake the waiter.
POLL_CAP = 0.02


def pidfd(pid: int) -> int | None:
    """A descriptor that turns readable when ``pid`` exits (Linux >= 5.3), or None."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        fd: int = opener(pid)
    except OSError:
        return None
    return fd


def _sleep_on(fds: Iterable[int], timeout: float) -> None:
    """Sleep up to ``timeout``, or less if one of ``fds`` turns readable."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    poller.poll(max(0.0, timeout) * 1000)


def wait_gone(procs: Iterable[ProcId], timeout: float) -> list[ProcId]:
    """Wait until the processes are gone (zombies count as gone); return those still alive.

    Each exit wakes the waiter through a pidfd (the process is identified again after the
    pidfd is opened, so a reused PID is never waited on); without pidfds it polls, at most
    POLL_CAP apart.
    """
    deadline = time.monotonic() + timeout
    fds = {p: pidfd(p.pid) for p in procs}
    pending = [p for p in fds if is_alive(p)]
    delay = 0.002
    try:
        while pending and time.monotonic() < deadline:
            watched = [fd for p in pending if (fd := fds[p]) is not None]
            nap = deadline - time.monotonic()
            if len(watched) < len(pending):
                nap = min(nap, delay)
                delay = min(delay * 2, POLL_CAP)
            _sleep_on(watched, nap)
            pending = [p for p in pending if is_alive(p)]
    finally:
        for fd in fds.values():
            if fd is not None:
                os.close(fd)
    return pending


def wait_exit(pid: int, done: Callable[[], bool], timeout: float) -> bool:
    """Sleep until ``done()`` or ``timeout``: woken by the exit itself through a pidfd, else
    polling at most POLL_CAP apart. The one wait for a child of ours to end."""
    deadline = time.monotonic() + timeout
    fd = pidfd(pid)
    delay = 0.002
    try:
        while not done() and time.monotonic() < deadline:
            nap = deadline - time.monotonic()
            if fd is None:
                nap, delay = min(nap, delay), min(delay * 2, POLL_CAP)
            _sleep_on([fd] if fd is not None else [], nap)
    finally:
        if fd is not None:
            os.close(fd)
    return done()


def wait_child(proc: Child, timeout: float) -> int | None:
    """The child's exit code once it has exited, or None if it still runs after ``timeout``
    (subprocess's own timed wait polls, up to 50 ms late, and raises its own exception)."""
    wait_exit(proc.pid, lambda: proc.poll() is not None, timeout)
    return proc.poll()


def backoff(timeout: float, first: float = 0.002, cap: float = 0.1) -> Iterable[float]:
    """Yield elapsed seconds at growing intervals until ``timeout``: bounded polling."""
    start = time.monotonic()
    delay = first
    while True:
        elapsed = time.monotonic() - start
        yield elapsed
        if elapsed >= timeout:
            return
        time.sleep(min(delay, max(0.0, timeout - elapsed)))
        delay = min(delay * 2, cap)
