"""Supervising ranks: start them as MPS clients, watch them, and end them safely.

Slurm (scancel, time limit) and mpirun signal every process of a step or rank at once, and a
signal to a busy MPS client can wedge the server. So a rank starts with SIGTERM, SIGINT and
SIGHUP ignored (dispositions survive exec; ``MPSWRAP_SHIELD`` names them) but stays in our
process group; the supervisor catches those signals and runs the ladder: ``terminate_client``
through the rank's daemon for the rank and its descendants, then the signal to each of them as
it would take it without the shield (a handler the program installed gets it; a process that
ignores it only through the shield gets its default action, by SIGKILL), then SIGKILL after
the grace period. SIGUSR1/SIGUSR2 are forwarded untouched. Exit code: the rank's, or
128+signal when it died of one or was ended because of one; never 0 because a signal arrived.
A rank's tree ends with it: what it left running (which inherited the shield) is ended
through the ladder once it exits, and anything that survives that makes the exit code 1 where
it would have been 0.

``watch`` is the one wait loop, for one rank (``srun mpswrap ./app``), N ranks
(``mpswrap run -n N``) and a launcher (``mpswrap srun ...``).
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import select
import shutil
import signal
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from .. import _proc
from .._signals import (
    FORWARDED,
    SHIELD_VAR,
    TERMINATING,
    Guard,
    SignalTrap,
    fork_guard,
    shield_value,
    signal_unshielded,
)
from .._struct import Struct, field, replace
from .._wait import TERM_GRACE, end_procs, pidfd, side_by_side
from ..errors import ProcError
from ..jobenv import TREE_VAR
from ..mps.daemon import Daemon
from .containers import runtime_of
from .outcomes import Outcome
from .verify import Verifier, seen_in_logs

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:
    from typing import NoReturn

__all__ = [
    "VERIFY_FAILED",
    "Rank",
    "check_program",
    "deliver",
    "end_leftovers",
    "end_ranks",
    "exit_code",
    "guard_ranks",
    "guarded",
    "outcomes_of",
    "sleep_on",
    "spawn_rank",
    "watch",
]

log = logging.getLogger(__name__)

#: Exit code when ``--verify-attach fail`` finds the program is not an MPS client:
#: sysexits' EX_UNAVAILABLE ("a service is unavailable"), apart from the program's own small
#: codes, usage errors (2) and signals (128+n).
VERIFY_FAILED = 69
#: Seconds from SIGTERM to SIGKILL for ranks ended because one is no MPS client.
VERIFY_GRACE = 2.0
#: The Slurm job a process belongs to, as Slurm sets it in every process of the job.
JOB_VAR = "SLURM_JOB_ID"
#: Exit codes of a program that cannot be started, as shells and srun report them.
NOT_FOUND, NOT_EXECUTABLE = 127, 126
#: How often the wait loop looks at the ranks when nothing wakes it.
IDLE_WAKE = 1.0
_TAGS = itertools.count()


class Rank(Struct):
    """A supervised child, its identity, and the daemon it should be a client of."""

    proc: _proc.Child
    ident: _proc.ProcId
    daemon: Daemon | None
    name: str = "rank"
    #: Its clients ended by terminate_client (the summary counts them).
    ended: int = 0
    #: Its clients ended with their server (``shutdown_server -f``): clients all the same.
    dropped: int = 0
    #: The value of ``TREE_VAR`` in its environment, which all it starts inherits ("": none).
    tag: str = ""
    #: What it left running once it exited has been ended (``end_leftovers``).
    swept: bool = False
    #: Its Slurm job: a job submitted from it (sbatch passes the environment) is not its own.
    job: str | None = None
    #: What it left that survived even SIGKILL.
    left: list[_proc.ProcId] = field(default_factory=list)
    #: Its program is a container runtime that starts the container outside its process
    #: tree (Podman's conmon): the container's processes are found by the tag passed in.
    detached: bool = False
    #: Started with TERM, INT and HUP ignored (the shield).
    shielded: bool = True
    #: The signal whose default action a SIGKILL of it stood in for (``signal_unshielded``).
    stood_in: int = 0
    #: The processes of its tree that such a SIGKILL ended: once it exits, they are going,
    #: not left behind.
    doomed: set[int] = field(default_factory=set)

    def tree(self, table: Mapping[int, list[_proc.ProcId]] | None = None) -> list[_proc.ProcId]:
        """The child and its descendants (a wrapper script's client counts; from ``table``,
        ``_proc.descendants`` of several ranks, where given); for a runtime that starts its
        container elsewhere, also the processes that carry the rank's tag."""
        kids = _proc.children_of(self.ident.pid) if table is None else table[self.ident.pid]
        found = [self.ident, *kids]
        if self.detached:
            found += [p for p, _ in _tagged([self]) if p not in found]
        return found

    def running(self) -> bool:
        return self.proc.poll() is None

    def code(self, returncode: int | None = None) -> int:
        """Its shell-style exit code (0 while it runs; ``returncode``: as reaped elsewhere):
        128+N after signal N, also where a SIGKILL stood in for the default action of N."""
        returncode = (self.proc.poll() or 0) if returncode is None else returncode
        if self.stood_in and returncode == -signal.SIGKILL:
            return 128 + self.stood_in
        return exit_code(returncode)


def exit_code(returncode: int) -> int:
    """A shell-style exit code: negative returncodes (killed by signal N) become 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def ended_how(returncode: int) -> str:
    """``exited with code 3``, or ``was killed by signal 9 (SIGKILL, exit code 137)``."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = f"{signal.Signals(-returncode).name}, "
    except ValueError:
        name = ""
    return f"was killed by signal {-returncode} ({name}exit code {exit_code(returncode)})"


# --- starting and ending ranks -----------------------------------------------------------
def check_program(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Fail like a shell (127/126) before forking when the program cannot run."""
    program = argv[0] if argv else ""
    path = program if "/" in program else _on_path(program, env.get("PATH", ""))
    try:
        info = os.stat(path) if path else None
    except FileNotFoundError:
        info = None
    except OSError as exc:  # a loop of links, a folder on the way we may not enter
        _cannot_execute(argv, path or program, exc.strerror or str(exc))
    if info is None:
        err = ProcError(
            "program not found",
            thing=program or ("'' (an empty name)" if argv else "(none)"),
            argv=list(argv),
            hint="check the name and PATH",
        )
        err.exit_code = NOT_FOUND
        raise err
    assert path is not None
    if not stat.S_ISREG(info.st_mode) or not info.st_mode & 0o111:  # a folder, a FIFO
        _cannot_execute(argv, path, "not an executable file")
    if not os.access(path, os.X_OK):
        _cannot_execute(argv, path, f"not executable by uid {os.geteuid()}")
    interpreter = _interpreter(path)
    if interpreter is not None and not os.access(interpreter, os.X_OK):
        # What the kernel's ENOENT means for a file that is there (bash: "bad interpreter").
        _cannot_execute(argv, path, f"its #! interpreter {interpreter} cannot be run")


def _cannot_execute(argv: Sequence[str], path: str, cause: str) -> NoReturn:
    err = ProcError("cannot execute program", thing=path, argv=list(argv), cause=cause)
    err.exit_code = NOT_EXECUTABLE
    raise err


def _interpreter(path: str) -> str | None:
    """The program a ``#!`` line names (None: no such line, or the file is unreadable, as it
    may be to us and not to the kernel)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    return os.fsdecode(words[0]) if words else None


def _on_path(program: str, search: str) -> str | None:
    """Where a shell finds ``program`` on ``search``: the first executable file, else the
    first file that is not (which then cannot be executed: 126, as bash says)."""
    found = shutil.which(program, path=search)
    if found or not program:
        return found
    files = (os.path.join(d or ".", program) for d in search.split(os.pathsep))
    return next((f for f in files if os.path.isfile(f)), None)


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
    tag: str | None = None,
    trapped: bool = False,
) -> Rank:
    """Start one client: shielded, in our process group, in the caller's directory. ``tag``:
    the caller's name for what it starts (``TREE_VAR``), whose program was checked once for
    all (a farm's ``/bin/sh``); else a fresh one, the program checked now. ``trapped``: the
    program shields itself (a farm's ``sh -c "trap '' TERM INT HUP; ..."``), started as is."""
    if tag is None:
        check_program(argv, env)
        tag = f"{os.getpid()}-{next(_TAGS)}-{os.urandom(4).hex()}"
    try:
        proc = _proc.spawn(
            argv,
            env={**env, TREE_VAR: tag, SHIELD_VAR: shield_value(shield)},
            new_session=False,  # terminal ^C and mpirun's group kill reach it; it ignores them
            ignore_signals=_proc.SHIELDED if shield and not trapped else (),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            cwd=None,
        )
    except ProcError as err:  # what only the exec finds: no #! line and no binary, say
        if err.what == "cannot execute program":
            err.exit_code = NOT_EXECUTABLE
            if err.cause == os.strerror(errno.ENOEXEC):
                err.hint = "a script needs a #! line, e.g. #!/bin/sh"
        raise
    # A child that already exited has no start time; 0 never matches, so it is never signalled.
    ident = _proc.identify(proc.pid) or _proc.ProcId(proc.pid, 0.0)
    container = runtime_of(argv)
    detached = container is not None and container[0].detached
    return Rank(
        proc, ident, daemon, name, tag=tag, job=env.get(JOB_VAR), detached=detached, shielded=shield
    )


def trees(ranks: Sequence[Rank]) -> list[list[_proc.ProcId]]:
    """Each rank's ``tree()``, from one reading of the process table for them all."""
    table = _proc.descendants(r.ident.pid for r in ranks)
    return [r.tree(table) for r in ranks]


def _tagged(ranks: Sequence[Rank]) -> list[tuple[_proc.ProcId, Rank]]:
    """The processes that carry a rank's tag, of the rank's own Slurm job: a job
    submitted from the rank inherits the tag with the rest of its environment."""
    tags = {r.tag: r for r in ranks if r.tag}
    found = []
    for proc, env in _proc.procs_with_env(TREE_VAR, JOB_VAR) if tags else []:
        rank = tags.get(env[TREE_VAR])
        if rank is not None and env.get(JOB_VAR) == rank.job:
            found.append((proc, rank))
    return found


def end_leftovers(ranks: Sequence[Rank]) -> list[_proc.ProcId]:
    """End what ranks that have exited left running; what survives even SIGKILL.

    A rank's program starts with TERM, INT and HUP ignored (the shield), and POSIX passes
    ignored signals on through fork and exec: a child it put in the background would shrug
    off ``kill`` and outlive the rank, naming the job's pipe directory. So once a rank has
    exited, every process that carries its tag is ended as Slurm ends a step's: its MPS
    clients through terminate_client, then SIGTERM, then SIGKILL.
    """
    done = [r for r in ranks if r.tag and not r.swept and not r.running()]
    for rank in done:
        rank.swept = True
    found = _tagged(done)
    if not found:
        return []
    for rank in {id(r): r for _, r in found}.values():
        mine = [p for p, r in found if r is rank]
        log.warning(
            "%s exited and left %s running: ending them",
            rank.name,
            ", ".join(map(_proc.describe, mine)),
        )
        if rank.daemon is not None:
            rank.ended += len(rank.daemon.end_clients({p.pid for p in mine}).terminated)
    left = end_unshielded([p for p, _ in found if _proc.is_alive(p)])
    for proc, rank in ((p, r) for p, r in found if p in left):
        log.error("%s: still running after SIGKILL: %s", rank.name, _proc.describe(proc))
        rank.left.append(proc)
    return left


def end_unshielded(
    procs: Sequence[_proc.ProcId],
    grace: float = TERM_GRACE,
    children: Sequence[_proc.Child] = (),
) -> list[_proc.ProcId]:
    """End what ranks or tasks left (their MPS clients ended already): SIGTERM as each would
    take it without the shield it inherited (``signal_unshielded``: one that ignores it is
    killed now, not after ``grace``), SIGKILL past ``grace`` for the rest and their
    descendants; what still lives is returned."""
    signal_unshielded(list(procs), signal.SIGTERM)
    return end_procs(procs, None, grace, children=children, tree=True)


def end_ranks(ranks: Sequence[Rank], sig: int, grace: float) -> None:
    """The ladder for ranks still running: terminate_client, ``sig`` (``deliver``), SIGKILL
    after ``grace``."""
    live = [r for r in ranks if r.running()]
    if not live:
        return
    log.debug("ladder: ending %d rank(s), then signal %d", len(live), sig)
    ended = _terminate_clients(live)
    # Under load the real daemon has answered a listing with nothing (seen with 12 ranks on
    # an H100): look once more for ranks none of whose processes was ended.
    running = [r for r in live if r.running()]
    again = [
        r
        for r, tree in zip(running, trees(running), strict=True)
        if not ended & {p.pid for p in tree}
    ]
    if again:
        time.sleep(0.2)
        _terminate_clients(again)
    live = [r for r in live if r.running()]

    def killing(left: list[_proc.ProcId]) -> list[_proc.ProcId]:
        log.debug(
            "ladder: %d of %d rank(s) still running", sum(r.running() for r in live), len(live)
        )
        for rank in (r for r in live if r.running()):
            log.warning(
                "%s (pid %d) still running %g s after signal %d: killing it",
                rank.name,
                rank.ident.pid,
                grace,
                sig,
            )
        return left

    deliver(live, sig)
    end_procs([], None, grace, children=[r.proc for r in live], tree=True, before_kill=killing)


def deliver(ranks: Sequence[Rank], sig: int) -> None:
    """``sig`` to ranks whose clients were ended: to every process of a shielded rank as it
    would take it without the shield (``signal_unshielded``), else to the rank's program."""
    for rank, tree in zip(ranks, trees(ranks), strict=True):
        if not rank.shielded:
            _proc.kill_procs([rank.ident], sig)
            continue
        killed = signal_unshielded(tree, sig)
        rank.doomed.update(p.pid for p in killed)
        if rank.ident in killed:
            rank.stood_in = sig


def _terminate_clients(ranks: Sequence[Rank]) -> set[int]:
    """End every MPS client among the ranks' process trees through their daemons' ladder
    (``Daemon.end_clients``), the GPUs side by side (each one's ``terminate_window`` runs
    at once with the others'); returns the PIDs it ended (terminated, or with their server).
    A GPU whose ladder fails is said, and the others' results still count: what follows (the
    signal, SIGKILL after the grace) ends every rank."""
    groups: dict[str, tuple[Daemon, dict[int, Rank]]] = {}  # pipe -> (daemon, pid -> rank)
    served = [r for r in ranks if r.daemon is not None]
    for rank, tree in zip(served, trees(served), strict=True):
        assert rank.daemon is not None
        group = groups.setdefault(str(rank.daemon.dirs.pipe), (rank.daemon, {}))
        group[1].update((p.pid, rank) for p in tree)
    ladders = [functools.partial(d.end_clients, set(owners)) for d, owners in groups.values()]
    reports = side_by_side(ladders)
    ended: set[int] = set()
    for (daemon, owners), report in zip(groups.values(), reports, strict=True):
        if isinstance(report, Exception):  # the ranks' signals and SIGKILL come all the same
            log.error("%s: its clients' ladder failed: %s", daemon.dirs.key, report)
            continue
        if isinstance(report, BaseException):
            raise report
        ended.update(report.terminated, report.dropped)
        for pid in report.terminated:
            if pid in owners:
                owners[pid].ended += 1
        for pid in report.dropped:
            if pid in owners:
                owners[pid].dropped += 1
        for note in report.notes:
            log.warning("%s: %s", daemon.dirs.key, note)
    return ended


@contextmanager
def guarded(ranks: Sequence[Rank], grace: float) -> Iterator[None]:
    """While inside, a forked guard ends the ranks through the ladder should this supervisor
    die first (SIGKILL, OOM killer): they ignore the SIGTERM that would otherwise end them."""
    guard = guard_ranks(ranks, grace)
    try:
        yield
    finally:
        guard.release()


def guard_ranks(ranks: Sequence[Rank], grace: float) -> Guard:
    """The guard of ``guarded``, for a caller that releases it itself (a farm's task)."""
    return fork_guard(lambda: _end_orphans(ranks, grace), ignore=(*TERMINATING, *FORWARDED))


def _end_orphans(ranks: Sequence[Rank], grace: float) -> None:
    """The guard's ladder: like ``end_ranks``, but the ranks are no longer our children."""
    live = [r for r in ranks if _proc.is_alive(r.ident)]
    if not live:
        return
    names = ", ".join(f"{r.name} (pid {r.ident.pid})" for r in live)
    log.warning("supervisor gone: ending %s through MPS terminate_client", names)
    _terminate_clients(live)
    deliver(live, signal.SIGTERM)
    end_procs([r.ident for r in live], None, grace, tree=True)


@contextmanager
def killed_on_error(ranks: Sequence[Rank]) -> Iterator[None]:
    """The ranks ignore the SIGTERM that would otherwise end them: if supervising them fails,
    never leave one behind, even when the ladder itself failed."""
    try:
        yield
    except BaseException:
        running = [r for r in ranks if r.running()]
        for rank in running:
            log.error("%s: supervisor failed: killing pid %d", rank.name, rank.ident.pid)
        end_procs([], signal.SIGKILL, children=[r.proc for r in running], tree=True)
        raise


# --- the one wait loop --------------------------------------------------------------------------
def watch(
    ranks: Sequence[Rank],
    trap: SignalTrap,
    *,
    grace: float,
    checks: Sequence[Verifier] = (),
    on_terminate: Callable[[int], None] | None = None,
    tick: Callable[[], float] | None = None,
    isolated: bool = False,
    more: Callable[[], bool] | None = None,
    readable: Callable[[], Sequence[int]] | None = None,
) -> int:
    """Wait until every rank has exited; return the exit code.

    USR1/USR2 go to the live ranks. The first TERM/INT/HUP runs ``on_terminate`` (default:
    the ladder for every rank). A rank that fails, or that a ``fail`` check finds without MPS,
    ends the others (``isolated``: itself). ``tick`` runs at each wake, may add ranks and checks
    (a farm), and says when to wake; ``more``: work remains though no rank runs; ``readable``:
    descriptors that wake it too (a farm's live output). Exit code:
    128+signal after a terminating signal, else (not isolated) the first failure's, else 0."""
    terminate = on_terminate or (lambda sig: end_ranks(ranks, sig, grace))
    ended_by: int | None = None
    failed: int | None = None
    with _ExitFds() as fds:
        while True:
            end_leftovers(ranks)
            if more is None and not any(r.running() for r in ranks):
                break  # fixed ranks, all gone: no signal taken, no tick after the last
            ended_by = _take_signals(ranks, trap, ended_by, terminate)
            pending = [c for c in checks if not c.done]
            if isolated:
                _refuse_unattached(pending, grace)
            elif ended_by is None and failed is None:
                failed = _first_failure(ranks, grace) or _failed_check(ranks, pending, grace)
            wake = min(
                [
                    IDLE_WAKE,
                    *(c.due_in() for c in pending if not c.done),
                    *([tick()] if tick else []),
                ]
            )
            live = [r for r in ranks if r.running()]
            if not live and not (more is not None and ended_by is None and more()):
                break  # a farm's last task is reaped by the tick above
            extra = list(readable()) if readable else []
            _nap(trap.wake_fd, fds.watch(live), wake, extra)
    return _exit_code(ranks, ended_by, failed, isolated, grace)


def _exit_code(
    ranks: Sequence[Rank], ended_by: int | None, failed: int | None, isolated: bool, grace: float
) -> int:
    """128+signal after a terminating signal, else (not isolated) the first failure's, else
    1 where something a rank left survived, else 0."""
    end_leftovers(ranks)
    if ended_by is not None:
        return 128 + ended_by
    code = failed if failed is not None else _first_failure(ranks, grace)
    return 0 if isolated else code or int(any(r.left for r in ranks))


def _take_signals(
    ranks: Sequence[Rank], trap: SignalTrap, ended_by: int | None, terminate: Callable[[int], None]
) -> int | None:
    """USR1/USR2 to the live ranks; the first terminating signal runs ``terminate``. Returns
    the terminating signal that came, if any."""
    for sig in trap.pop():
        if sig in FORWARDED:
            _proc.kill_procs([r.ident for r in ranks if r.running()], sig)
        elif ended_by is None:
            ended_by = sig
            terminate(sig)
    return ended_by


def _first_failure(ranks: Sequence[Rank], grace: float) -> int | None:
    for rank in ranks:
        code = rank.proc.poll()
        if code:
            if any(r.running() for r in ranks):
                log.error("%s %s: ending the other ranks", rank.name, ended_how(code))
                end_ranks(ranks, signal.SIGTERM, grace)
            return exit_code(code)
    return None


def _failed_check(ranks: Sequence[Rank], checks: Sequence[Verifier], grace: float) -> int | None:
    """A ``fail`` check that found its rank without MPS ends every rank. The grace is short:
    that rank is no client (nothing of MPS to wedge), and the others are ended through
    terminate_client first, after which killing them is safe."""
    if any(check.failed() for check in checks):
        end_ranks(ranks, signal.SIGTERM, min(grace, VERIFY_GRACE))
        return VERIFY_FAILED
    return None


def _refuse_unattached(checks: Sequence[Verifier], grace: float) -> None:
    """Isolated ranks: a ``fail`` check ends its own rank (``Verifier.refused`` says why)."""
    for check in checks:
        if check.failed() and isinstance(check.rank, Rank):
            end_ranks([check.rank], signal.SIGTERM, min(grace, VERIFY_GRACE))


class _ExitFds:
    """Per rank, a pidfd that turns readable when it exits (Linux >= 5.3), opened when first
    asked for and closed once the rank is no longer asked for; ranks without one are polled."""

    def __init__(self) -> None:
        self._fds: dict[int, tuple[Rank, int | None]] = {}  # id(rank) -> (rank, fd)
        self._asked: set[int] = set()

    def of(self, rank: Rank) -> int | None:
        entry = self._fds.get(id(rank))
        if entry is None:
            entry = self._fds[id(rank)] = (rank, pidfd(rank.proc.pid))
        self._asked.add(id(rank))
        return entry[1]

    def __enter__(self) -> _ExitFds:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close(set(self._fds))

    def watch(self, live: Sequence[Rank]) -> list[int | None]:
        """The descriptors of ``live``; those of the ranks no longer live are closed."""
        fds = [self.of(r) for r in live]
        self._close(set(self._fds) - self._asked)
        self._asked.clear()
        return fds

    def _close(self, keys: set[int]) -> None:
        for key in keys:
            fd = self._fds.pop(key)[1]
            if fd is not None:
                os.close(fd)


def _nap(wake_fd: int, live: list[int | None], wake: float, extra: Sequence[int] = ()) -> None:
    """Sleep until a rank with a pidfd exits, a signal comes, one of ``extra`` is readable, or
    ``wake``; ranks without a pidfd are polled (0.05 s)."""
    watched = [fd for fd in live if fd is not None]
    timeout = wake if len(watched) == len(live) else min(wake, 0.05)
    sleep_on([wake_fd, *watched, *extra], timeout)


def sleep_on(fds: list[int], timeout: float) -> None:
    """poll, not select: a farm may hold descriptors past select's 1024."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    try:
        poller.poll(max(0.0, timeout) * 1000)
    except InterruptedError:
        pass


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
    start: float | None = None,
) -> Outcome:
    """Run ``argv`` as this rank's MPS client until it exits; return how it ended (its exit
    code: the program's, 128+signal, or 69 when ``fail`` found it without MPS)."""
    start = time.time() if start is None else start
    with SignalTrap() as trap:
        rank = spawn_rank(argv, env, daemon, shield=shield, name=name)
        checks = Verifier.for_ranks([rank], verify_attach, verify_timeout)
        with guarded([rank], grace), killed_on_error([rank]):
            code = watch([rank], trap, grace=grace, checks=checks)
    return replace(outcomes_of([rank], checks, start)[0], code=code)


def outcomes_of(ranks: Sequence[Rank], checks: Sequence[Verifier], start: float) -> list[Outcome]:
    """How each rank ended, once ``watch`` returned: for the summary. A rank that
    terminate_client ended was a client, whether or not its check had seen it yet, and so
    was one its daemon's log says connected (``seen_in_logs``)."""
    seen_in_logs(checks)
    checked = {id(c.rank): c.listed for c in checks}
    refused = {id(c.rank) for c in checks if c.refused}

    def code(rank: Rank) -> int:
        return VERIFY_FAILED if id(rank) in refused else rank.code()

    def attached(rank: Rank) -> bool | None:
        seen = checked.get(id(rank))
        return None if seen is None else seen or rank.ended + rank.dropped > 0

    return [Outcome(code(r), attached(r), r.ended, start, id(r) in refused) for r in ranks]
