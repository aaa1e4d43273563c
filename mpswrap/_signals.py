"""Signals: the trap the wait loops read, the guard that outlives a killed supervisor, and
the shield a supervised program starts with.

Slurm (scancel, time limit) and mpirun signal every process of a step at once, so handlers
only record a signal and wake the loop (a wakeup fd); the loop acts. A forked guard acts for
its parent if that parent is SIGKILLed (the death closes the guard's pipe). A rank starts with
TERM, INT and HUP ignored (``_proc.SHIELDED``), which its whole tree inherits: once its MPS
clients are ended, ``signal_unshielded`` gives each process what it would have got without
the shield, and ``unshield`` lets a process that never touches CUDA take it off itself.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from ._proc import SHIELDED, ProcId, is_alive, kill_procs
from ._struct import Struct
from ._wait import end_procs

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = [
    "FORWARDED",
    "SHIELD_VAR",
    "TERMINATING",
    "Guard",
    "Interrupted",
    "SignalTrap",
    "fork_guard",
    "hold",
    "raising",
    "shield_value",
    "signal_unshielded",
    "unshield",
]

log = logging.getLogger(__name__)

#: Signals that end a step (the ladder runs first) and signals passed to the ranks untouched.
TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2)
#: In a supervised program's environment: the signals it started with ignored
#: (``TERM,INT,HUP``; empty under ``--no-shield``).
SHIELD_VAR = "MPSWRAP_SHIELD"


def shield_value(shield: bool) -> str:
    """``SHIELD_VAR``'s value for a program started with or without the shield."""
    return ",".join(signal.Signals(s).name.removeprefix("SIG") for s in SHIELDED) if shield else ""


def unshield() -> None:
    """Give this process the default action of the signals mpswrap's shield made it ignore
    (those ``MPSWRAP_SHIELD`` names): SIGTERM and SIGHUP end it, SIGINT raises
    ``KeyboardInterrupt``.

    For a process that never touches CUDA (a multiprocessing worker, a data loader): it can
    harm no MPS server, and ``Process.terminate()`` and Ctrl-C then work on it. A signal it
    handles already is left alone, and outside mpswrap nothing changes. Call it from the
    process's main thread, as ``signal.signal`` requires.
    """
    for name in os.environ.get(SHIELD_VAR, "").split(","):
        sig = getattr(signal, f"SIG{name}", None)
        if sig in SHIELDED and signal.getsignal(sig) is signal.SIG_IGN:
            default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
            signal.signal(sig, default)


def _ignores(proc: ProcId, sig: int) -> bool:
    """Whether the identified process ignores ``sig`` (``SigIgn`` of /proc/<pid>/status: the
    kernel's word, whatever language the program is in); False when it is gone."""
    try:
        with open(f"/proc/{proc.pid}/status", "rb") as handle:
            masks = [line.split()[1] for line in handle if line.startswith(b"SigIgn:")]
        return bool(int(masks[0], 16) >> (sig - 1) & 1) and is_alive(proc)
    except (OSError, ValueError, IndexError):
        return False


def signal_unshielded(procs: Sequence[ProcId], sig: int) -> list[ProcId]:
    """``sig`` (one of ``SHIELDED``) to each process as it would take it without the shield
    it inherited: one that handles the signal, or has it at its default, gets it; one that
    ignores it gets its default action, termination, by SIGKILL. Returns those SIGKILLed.

    Only for processes whose MPS clients have been ended (``terminate_client``): a signal on
    a busy client can harm its server (tests/contract/test_signal_harm.py).
    """
    assert sig in SHIELDED, sig
    ignoring = [p for p in procs if _ignores(p, sig)]
    kill_procs([p for p in procs if p not in ignoring], sig)
    kill_procs(ignoring, signal.SIGKILL)
    return ignoring


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


class Interrupted(BaseException):
    """A terminating signal, raised (``raising``) where a command's own cleanup must run
    before it exits: ``main`` exits 128+N, as the signal's default action would."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def hold(signals: Sequence[int] = TERMINATING) -> None:
    """Ignore ``signals`` from here on, within ``raising`` (which restores them): a cleanup
    that must run to its end."""
    for sig in signals:
        signal.signal(sig, signal.SIG_IGN)


@contextmanager
def raising(signals: Sequence[int] = TERMINATING) -> Iterator[None]:
    """Within it, the first of ``signals`` raises Interrupted and the rest are ignored from
    then on, so the cleanup it interrupts for runs to its end; leaving restores them. For a
    command that holds no supervised program (``demo``): a run's wait loop uses SignalTrap."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        hold(signals)
        raise Interrupted(signum)

    saved = {sig: signal.signal(sig, interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
