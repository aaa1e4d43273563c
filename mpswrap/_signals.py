"""Signals: the trap the wait loops read, and the guard that outlives a killed supervisor.

Slurm (scancel, time limit) and mpirun signal every process of a step at once, so handlers
only record a signal and wake the loop (a wakeup fd); the loop acts. A forked guard acts for
its parent if that parent is SIGKILLed (the death closes the guard's pipe).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Sequence
from types import FrameType

from ._struct import Struct
from ._wait import end_procs

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = ["FORWARDED", "TERMINATING", "Guard", "SignalTrap", "fork_guard"]

log = logging.getLogger(__name__)

#: Signals that end a step (the ladder runs first) and signals passed to the ranks untouched.
TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2)


class SignalTrap:
    """Record TERM/INT/HUP/USR1/USR2 instead of acting inside the handler.

    Acting happens in the wait loop, which a wakeup fd rouses at once. Entering installs the
    handlers; leaving restores the previous ones and the previous wakeup fd.
    """

    def __init__(self, signals: Sequence[int] = (*TERMINATING, *FORWARDED)) -> None:
        self.signals = tuple(signals)
        self.pending: list[int] = []
        #: The first terminating signal that came (a run it ended says so).
        self.stopped_by: int | None = None
        self._saved: dict[int, Any] = {}
        self._fds: tuple[int, int] | None = None
        self._old_wakeup = -1

    def __enter__(self) -> SignalTrap:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        self._fds = (read_fd, write_fd)
        self._old_wakeup = signal.set_wakeup_fd(write_fd)
        for sig in self.signals:
            self._saved[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._saved.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(self._old_wakeup)
        if self._fds:
            for fd in self._fds:
                os.close(fd)
        self._fds = None

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.pending.append(signum)
        if signum in TERMINATING and self.stopped_by is None:
            self.stopped_by = signum

    @property
    def wake_fd(self) -> int:
        assert self._fds is not None
        return self._fds[0]

    def pop(self) -> list[int]:
        """Signals received since the last call, oldest first; drains the wakeup fd."""
        try:
            while os.read(self.wake_fd, 512):
                pass
        except BlockingIOError:
            pass
        taken, self.pending[:] = list(self.pending), []
        return taken


class Guard(Struct):
    """A forked process that acts if its parent dies before ``release`` (see ``fork_guard``)."""

    pid: int
    fd: int
    #: Its exit code once reaped (``poll``).
    code: int | None = None

    def release(self, timeout: float = 5.0) -> None:
        """Tell the guard all is well, and reap it (bounded; killed if it lingers)."""
        try:
            os.write(self.fd, b"x")
        except OSError:
            pass  # the guard is gone already (killed with the step): nothing to tell
        os.close(self.fd)
        end_procs([], None, timeout, children=[self])  # told already: no signal first

    def poll(self) -> int | None:
        """Its exit code once it has exited, reaping it; else None (a ``Child``)."""
        if self.code is None:  # waitpid succeeds once: remember it
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.code = 0  # reaped elsewhere: gone all the same
            else:
                self.code = os.waitstatus_to_exitcode(status) if pid else None
        return self.code


def fork_guard(on_orphaned: Callable[[], None], ignore: Sequence[int]) -> Guard:
    """Fork a guard that runs ``on_orphaned`` if this process dies without ``Guard.release``
    (SIGKILL, the OOM killer): the death closes the only write end of the guard's pipe.

    Fork only while no thread runs. The guard ignores ``ignore`` (the signals Slurm and mpirun
    send to every process at once), keeps no descriptor of ours but stdio and its pipe, and
    exits after ``on_orphaned`` or the release.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        _guard_main(read_fd, on_orphaned, ignore)
    os.close(read_fd)
    return Guard(pid, write_fd)


def _guard_main(read_fd: int, on_orphaned: Callable[[], None], ignore: Sequence[int]) -> None:
    code = 0
    try:
        signal.set_wakeup_fd(-1)
        for sig in ignore:
            signal.signal(sig, signal.SIG_IGN)
        for fd in map(int, os.listdir("/proc/self/fd")):
            if fd > 2 and fd != read_fd:
                try:
                    os.close(fd)
                except OSError:
                    pass  # the descriptor of the listing itself, closed already
        while True:
            try:
                told = os.read(read_fd, 1)
                break
            except InterruptedError:
                continue
        if not told:
            on_orphaned()
    except BaseException:
        log.exception("guard failed")
        code = 1
    finally:
        os._exit(code)
