"""Waiting for processes to exit: the one place mpswrap waits, and ends processes.

Each wait wakes on the exit itself through a pidfd (Linux >= 5.3); where there is none it
polls, at most ``POLL_CAP`` apart. Every wait is bounded and returns what it found: nothing
here raises a foreign exception type on a timeout.

``end_procs`` is the one "end a process" tail: a signal, up to a grace to exit, SIGKILL what
is still alive (with its descendants where asked), a bounded wait for that; it returns what
still lives. Our own children are reaped on the way. The signals go through ``_proc``,
which identifies every process by PID and start time.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from ._proc import ProcId, children_of, identify, is_alive, kill_procs

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import TypeVar

    from ._proc import Child

    T = TypeVar("T")

__all__ = [
    "KILL_WAIT",
    "POLL_CAP",
    "TERM_GRACE",
    "Deadline",
    "backoff",
    "end_procs",
    "pidfd",
    "side_by_side",
    "wait_child",
    "wait_exit",
    "wait_gone",
]

#: Longest sleep between two looks at a process that has no pidfd to wake the waiter.
POLL_CAP = 0.02
#: ``end_procs``'s default seconds from its signal to the SIGKILL: a process that handles
#: SIGTERM gets a second to run its handler.
TERM_GRACE = 1.0
#: Seconds ``end_procs`` waits for what it SIGKILLed to be gone. SIGKILL cannot be caught,
#: but a process is gone only once the kernel has released what it held (a GPU context, I/O
#: in flight). One value for every caller: the longest of the waits it replaced (a rank's,
#: 5 s; a client's or a leftover's was 2 s), so none waits less than it did; the wait ends at
#: the exit itself, so it costs only where a process is slow to go.
KILL_WAIT = 5.0


class Deadline:
    """One bound for a whole piece of work (the epilog's teardown): every command, wait and
    scan in it takes ``bound(its own timeout)``, so no number of them, however slow each is
    made, outlasts it. ``Deadline(None)`` never ends."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self._end = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left (never below 0; a large number for a deadline that never ends)."""
        if self._end is None:
            return float("inf")
        return max(0.0, self._end - time.monotonic())

    @property
    def passed(self) -> bool:
        return self.left() <= 0.0

    def bound(self, timeout: float) -> float:
        """``timeout``, or what is left of the deadline where that is less."""
        return min(timeout, self.left())

    def reserving(self, seconds: float) -> Deadline:
        """The same deadline, ``seconds`` sooner: for the steps that must leave those
        seconds to the ones after them (the teardown's polite steps, its forced end)."""
        if self._end is None:
            return self
        earlier = Deadline(None)
        earlier.seconds = self.seconds
        earlier._end = self._end - seconds
        return earlier


#: The deadline of work that has none of its own.
NO_DEADLINE = Deadline(None)


def side_by_side(calls: Sequence[Callable[[], T]]) -> list[T | BaseException]:
    """Run ``calls`` at once, one thread each (the first in this one), and return each one's
    result or the exception it raised, in order: a node's GPUs each wait on their own daemon
    and driver, so their starts and teardowns overlap instead of adding up. One call runs
    alone, without a thread."""
    out: list[T | BaseException] = [ValueError("not run")] * len(calls)

    def run(index: int) -> None:
        try:
            out[index] = calls[index]()
        except BaseException as exc:
            out[index] = exc

    if len(calls) > 1:
        import threading

        threads = [threading.Thread(target=run, args=(i,)) for i in range(1, len(calls))]
        for thread in threads:
            thread.start()
        run(0)
        for thread in threads:
            thread.join()
    elif calls:
        run(0)
    return out


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


def end_procs(
    procs: Iterable[ProcId],
    sig: int | None = signal.SIGTERM,
    grace: float = TERM_GRACE,
    *,
    children: Iterable[Child] = (),
    tree: bool = False,
    before_kill: Callable[[list[ProcId]], Iterable[ProcId]] | None = None,
) -> list[ProcId]:
    """End ``procs`` and ``children``: ``sig``, up to ``grace`` seconds to exit, SIGKILL what
    is still alive, up to ``KILL_WAIT`` seconds more; return what still lives.

    ``children`` are our own children (``spawn``'s, a fork): each is reaped once it exits,
    so it leaves no zombie and its ``poll()`` has its exit code. ``sig`` None: they were asked
    to end some other way (terminate_client, a word on a pipe), only wait. ``sig`` SIGKILL: no
    grace, only the kill and its wait. ``tree``: the SIGKILL goes to the descendants of each
    survivor too, found at that moment. ``before_kill`` sees the survivors of the grace (also
    when there are none) and returns those to kill: a caller logs them, or leaves out what it
    may not signal (then not returned: not for this call to end).
    """
    kids: dict[ProcId, Child] = {}
    for child in children:
        ident = identify(child.pid) if child.poll() is None else None  # unreaped: still its PID
        if ident is not None:
            kids[ident] = child
    left = list(dict.fromkeys([*procs, *kids]))
    if sig != signal.SIGKILL:
        if sig is not None:
            kill_procs(left, sig)
        left = _survivors(left, kids, grace)
        if before_kill is not None:
            left = list(before_kill(left))
    if tree:
        left += [d for p in left if is_alive(p) for d in children_of(p.pid)]
        left = list(dict.fromkeys(left))
    if not left:
        return []
    kill_procs(left, signal.SIGKILL)
    return _survivors(left, kids, KILL_WAIT)


def _survivors(procs: list[ProcId], kids: Mapping[ProcId, Child], timeout: float) -> list[ProcId]:
    """Those of ``procs`` still alive after up to ``timeout`` seconds: our children by their
    exit, reaping them (a zombie of ours is gone only once reaped), the others by
    ``wait_gone``."""
    deadline = time.monotonic() + timeout
    left = wait_gone([p for p in procs if p not in kids], timeout)
    for ident in (p for p in procs if p in kids):
        if wait_child(kids[ident], deadline - time.monotonic()) is None:
            left.append(ident)
    return left
