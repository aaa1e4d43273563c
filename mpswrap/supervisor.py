"""The per-rank supervisor: run one program as an MPS client and end it safely.

Slurm (scancel, time limit) and mpirun signal every process of a step or rank at once, and a
signal to a busy MPS client can wedge the server. So the child starts with SIGTERM, SIGINT and
SIGHUP ignored (dispositions survive exec) but stays in our process group; the supervisor
catches those signals and runs the ladder: ``terminate_client`` for the child and its
descendants, then the signal itself (a program that installed its own handler still sees it),
then SIGKILL after the grace period. SIGUSR1/SIGUSR2 are forwarded untouched. Handlers are
restored before returning. Exit code: the child's, or 128+signal when it died of a signal or
was ended because of one; never 0 because a signal arrived.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from . import _lock, _proc
from .daemon import Daemon
from .errors import ControlError, MpswrapError, ProcError

__all__ = [
    "FORWARDED",
    "TERMINATING",
    "VERIFY_FAILED",
    "Rank",
    "SignalTrap",
    "end_ranks",
    "exit_code",
    "guarded",
    "spawn_rank",
    "supervise",
]

log = logging.getLogger(__name__)

TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2)
#: Exit code when ``--verify-attach fail`` finds the program is not an MPS client:
#: sysexits' EX_UNAVAILABLE ("a service is unavailable"), apart from the program's own small
#: codes, usage errors (2) and signals (128+n).
VERIFY_FAILED = 69
#: Exit codes of a program that cannot be started, as shells and srun report them.
NOT_FOUND, NOT_EXECUTABLE = 127, 126
#: How often the wait loop looks at the child when nothing wakes it.
IDLE_WAKE = 1.0


class Child(Protocol):
    """What the supervisor needs of a started process (``subprocess.Popen``)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class Rank:
    """A supervised child, its identity, and the daemon it should be a client of."""

    proc: Child
    ident: _proc.ProcId
    daemon: Daemon | None
    name: str = "rank"
    #: The daemon's start/stop lock: ladders of many ranks take turns at its control socket.
    lock: Path | None = None

    def tree(self) -> list[_proc.ProcId]:
        """The child and its descendants (a wrapper script's client counts)."""
        return [self.ident, *_proc.children_of(self.ident.pid)]


def exit_code(returncode: int) -> int:
    """A shell-style exit code: negative returncodes (killed by signal N) become 128+N."""
    return 128 - returncode if returncode < 0 else returncode


# --- signals ---------------------------------------------------------------------------
class SignalTrap:
    """Record TERM/INT/HUP/USR1/USR2 instead of acting inside the handler.

    Acting happens in the wait loop, which a wakeup fd rouses at once. Entering installs the
    handlers; leaving restores the previous ones and the previous wakeup fd.
    """

    def __init__(self, signals: Sequence[int] = (*TERMINATING, *FORWARDED)) -> None:
        self.signals = tuple(signals)
        self.pending: list[int] = []
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


# --- starting and ending ranks -----------------------------------------------------------
def _check_program(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Fail like a shell (127/126) before forking when the program cannot run."""
    program = argv[0] if argv else ""
    path = program if "/" in program else shutil.which(program, path=env.get("PATH", ""))
    if not path or not os.path.exists(path):
        err = ProcError(
            "program not found",
            thing=program or "(none)",
            argv=list(argv),
            hint="check the name and PATH",
        )
        err.exit_code = NOT_FOUND
        raise err
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        err = ProcError(
            "cannot execute program", thing=path, argv=list(argv), cause="not an executable file"
        )
        err.exit_code = NOT_EXECUTABLE
        raise err


def spawn_rank(
    argv: Sequence[str],
    env: Mapping[str, str],
    daemon: Daemon | None,
    *,
    shield: bool = True,
    name: str = "rank",
    stdout: int | None = None,
    stderr: int | None = None,
    stdin: int | None = None,
    lock: Path | None = None,
) -> Rank:
    """Start one client: shielded, in our process group, in the caller's directory."""
    _check_program(argv, env)
    proc = _proc.spawn(
        argv,
        env=env,
        new_session=False,  # terminal ^C and mpirun's group kill reach it; it ignores them
        ignore_signals=_proc.SHIELDED if shield else (),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        cwd=None,
    )
    # A child that already exited has no start time; 0 never matches, so it is never signalled.
    ident = _proc.identify(proc.pid) or _proc.ProcId(proc.pid, 0.0)
    return Rank(proc, ident, daemon, name, lock)


def end_ranks(ranks: Sequence[Rank], sig: int, grace: float) -> None:
    """The ladder for ranks still running: terminate_client, ``sig``, SIGKILL after ``grace``."""
    live = [r for r in ranks if r.proc.poll() is None]
    if not live:
        return
    ended = _terminate_clients(live)
    # Under load the real daemon has answered a listing with nothing (seen with 12 ranks on
    # an H100): look once more for ranks none of whose processes was ended.
    again = [r for r in live if r.proc.poll() is None and not ended & {p.pid for p in r.tree()}]
    if again:
        time.sleep(0.2)
        _terminate_clients(again)
    live = [r for r in live if r.proc.poll() is None]
    _proc.kill_procs([r.ident for r in live], sig)
    deadline = time.monotonic() + grace
    for rank in live:
        _wait(rank.proc, max(0.0, deadline - time.monotonic()))
    survivors = [r for r in live if r.proc.poll() is None]
    for rank in survivors:
        log.warning(
            "%s (pid %d) still running %g s after signal %d: killing it",
            rank.name,
            rank.ident.pid,
            grace,
            sig,
        )
        _proc.kill_procs(rank.tree(), signal.SIGKILL)
    for rank in survivors:
        _wait(rank.proc, 5.0)


@contextmanager
def guarded(ranks: Sequence[Rank], grace: float) -> Iterator[None]:
    """While inside, a forked guard ends the ranks through the ladder should this supervisor
    die first (SIGKILL, OOM killer): they ignore the SIGTERM that would otherwise end them."""
    guard = _proc.fork_guard(lambda: _end_orphans(ranks, grace), ignore=(*TERMINATING, *FORWARDED))
    try:
        yield
    finally:
        guard.release()


def _end_orphans(ranks: Sequence[Rank], grace: float) -> None:
    """The guard's ladder: like ``end_ranks``, but the ranks are no longer our children."""
    live = [r for r in ranks if _proc.is_alive(r.ident)]
    if not live:
        return
    names = ", ".join(f"{r.name} (pid {r.ident.pid})" for r in live)
    log.warning("supervisor gone: ending %s through MPS terminate_client", names)
    _terminate_clients(live)
    idents = [r.ident for r in live]
    _proc.kill_procs(idents, signal.SIGTERM)
    for ident in _proc.wait_gone(idents, grace):
        _proc.kill_procs([ident, *_proc.children_of(ident.pid)], signal.SIGKILL)


def _terminate_clients(ranks: Sequence[Rank]) -> set[int]:
    """``terminate_client`` every MPS client among the ranks' process trees, per daemon;
    returns the PIDs it ended."""
    groups: dict[str, tuple[Daemon, Path | None, set[int]]] = {}
    for rank in ranks:
        if rank.daemon is not None:
            key = str(rank.daemon.dirs.pipe)
            groups.setdefault(key, (rank.daemon, rank.lock, set()))[2].update(
                p.pid for p in rank.tree()
            )
    ended: set[int] = set()
    for daemon, lock, pids in groups.values():
        ended |= _end_clients(daemon, lock, pids)
    return ended


def _end_clients(daemon: Daemon, lock: Path | None, pids: set[int]) -> set[int]:
    """Like ``Daemon.end_clients``, but the control commands are sent under the daemon's lock.

    The real daemon refuses a command while it talks to another ("Cannot send command"):
    twelve ladders at once on an H100 ran out of retries and a client was SIGKILLed. Only
    the commands are serialised; waiting for the clients to exit is not.
    """
    control, ended = daemon.control, set()
    idents = [p for p in map(_proc.identify, pids) if p]
    try:
        with _locked(lock, daemon.settings.terminate_timeout * 4):
            for server in control.server_list():
                for pid in (c for c in control.client_list(server) if c in pids):
                    try:
                        control.terminate_client(server, pid)
                        ended.add(pid)
                    except ControlError as exc:
                        log.warning("terminate_client %d: %s", pid, exc.line())
    except ControlError as exc:
        log.warning("could not list MPS clients of %s: %s", daemon.dirs.pipe, exc.line())
    alive = _proc.wait_gone(
        [p for p in idents if p.pid in ended], daemon.settings.terminate_timeout
    )
    if alive:  # terminated but still running: not in a CUDA call for that long
        _proc.kill_procs(alive, signal.SIGKILL)
        _proc.wait_gone(alive, 2.0)
    log.debug("terminated clients %s (still alive after it: %s)", sorted(ended), alive)
    return ended


@contextmanager
def _locked(lock: Path | None, timeout: float) -> Iterator[None]:
    """Hold ``lock`` if it can be had within ``timeout``; else go on without it.

    The lock only spaces out control commands: a ladder must never fail for want of it.
    """
    if lock is None:
        yield
        return
    held = _lock.file_lock(lock, timeout=timeout)
    try:
        held.acquire()
    except TimeoutError:
        log.warning("%s busy for %g s: ending clients without it", lock, timeout)
        yield
        return
    except OSError as exc:
        log.warning("cannot take %s (%s): ending clients without it", lock, exc.strerror or exc)
        yield
        return
    try:
        yield
    finally:
        held.release()


def _wait(proc: Child, timeout: float) -> int | None:
    try:
        return proc.wait(timeout=timeout)
    except Exception:  # subprocess.TimeoutExpired: _proc owns the subprocess module
        return proc.poll()


# --- attachment check --------------------------------------------------------------------
class Verifier:
    """Polls the daemon's client list until the rank (or a descendant) is listed; bounded.

    CUDA runs a program that misses its daemon without MPS, silently: this is the check.
    """

    def __init__(self, rank: Rank, daemon: Daemon, timeout: float, mode: str) -> None:
        self.rank, self.daemon, self.timeout, self.mode = rank, daemon, timeout, mode
        self.start = self.next_at = time.monotonic()
        self.delay = 0.02
        self.done = False

    def due_in(self) -> float:
        return max(0.0, self.next_at - time.monotonic())

    def failed(self) -> bool:
        """One poll when due: True when the rank must be ended (``fail`` and time is up)."""
        if self.done or self.due_in() or self.rank.proc.poll() is not None:
            self.done = self.done or self.rank.proc.poll() is not None
            return False
        if self._listed():
            self.done = True
            return False
        if time.monotonic() - self.start < self.timeout:
            self.next_at = time.monotonic() + self.delay
            self.delay = min(self.delay * 2, 0.5)
            return False
        self.done = True
        if self.mode == "fail":
            print(self.error().render(), file=sys.stderr, flush=True)
            return True
        log.warning("%s", self.error().line())
        return False

    def _listed(self) -> bool:
        pids = {p.pid for p in self.rank.tree()}
        control = self.daemon.control
        try:
            servers = control.server_list()
            return any(pid in pids for server in servers for pid in control.client_list(server))
        except ControlError as exc:
            log.debug("verify: %s", exc.line())
            return False

    def error(self) -> MpswrapError:
        return MpswrapError(
            f"{self.rank.name} is not an MPS client",
            thing=f"pid {self.rank.ident.pid}, pipe {self.daemon.dirs.pipe}",
            cause=f"not among the daemon's clients after {self.timeout:g} s",
            hint="the program runs without MPS: does it (or a wrapper script) set "
            "CUDA_MPS_PIPE_DIRECTORY? raise --verify-timeout if CUDA starts late",
        )


def verifiers(ranks: Sequence[Rank], mode: str | None, timeout: float) -> list[Verifier]:
    return [Verifier(r, r.daemon, timeout, mode) for r in ranks if mode and r.daemon]


# --- the supervisor ------------------------------------------------------------------------
def supervise(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    daemon: Daemon | None,
    grace: float,
    shield: bool = True,
    verify_attach: str | None = None,
    verify_timeout: float = 30.0,
    name: str = "rank",
    lock: Path | None = None,
) -> int:
    """Run ``argv`` as this rank's MPS client until it exits; return the exit code."""
    with SignalTrap() as trap:
        rank = spawn_rank(argv, env, daemon, shield=shield, name=name, lock=lock)
        checks = verifiers([rank], verify_attach, verify_timeout)
        with guarded([rank], grace):
            try:
                return _watch(rank, trap, grace, checks)
            except BaseException:
                # The child ignores the SIGTERM that would otherwise end it: never leave it
                # behind, even when the ladder itself failed.
                if rank.proc.poll() is None:
                    log.error("%s: supervisor failed: killing pid %d", name, rank.ident.pid)
                    _proc.kill_procs(rank.tree(), signal.SIGKILL)
                    _wait(rank.proc, 5.0)
                raise


def _watch(rank: Rank, trap: SignalTrap, grace: float, checks: list[Verifier]) -> int:
    ended_by: int | None = None
    with _exit_fd(rank.proc.pid) as exit_fd:
        while True:
            for sig in trap.pop():
                ended_by = _on_signal(rank, sig, ended_by, grace)
            code = rank.proc.poll()
            if code is not None:
                return 128 + ended_by if ended_by else exit_code(code)
            if ended_by is None and any(check.failed() for check in checks):
                end_ranks([rank], signal.SIGTERM, grace)
                return VERIFY_FAILED
            checks = [c for c in checks if not c.done]
            timeout = min([c.due_in() for c in checks], default=IDLE_WAKE)
            _sleep([trap.wake_fd, *([exit_fd] if exit_fd is not None else [])], timeout)


def _on_signal(rank: Rank, sig: int, ended_by: int | None, grace: float) -> int | None:
    if sig in FORWARDED:
        _proc.kill_procs([rank.ident], sig)
        return ended_by
    if ended_by is not None:
        log.debug("signal %d while already ending %s: ignored", sig, rank.name)
        return ended_by
    log.info(
        "%s: signal %d: ending pid %d through MPS terminate_client", rank.name, sig, rank.ident.pid
    )
    end_ranks([rank], sig, grace)
    return sig


@contextmanager
def _exit_fd(pid: int) -> Iterator[int | None]:
    """A pidfd that becomes readable when the child exits (Linux ≥ 5.3), else None (poll)."""
    fd = _proc.pidfd(pid)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _sleep(fds: list[int], timeout: float) -> None:
    # Without a pidfd the child's exit is only seen at the next wake: keep that short.
    timeout = timeout if len(fds) > 1 else min(timeout, 0.05)
    try:
        select.select(fds, [], [], timeout)
    except InterruptedError:
        pass
