"""The one owner of subprocesses, signals, kills and privilege drop.

Rules kept here so no other module has to remember them:
- argv lists only, never a shell; the environment is always passed explicitly;
- every call is bounded: on timeout the whole process group is killed and the captured
  output is raised with the error;
- a process is identified by PID *and* start time, never by name, so a reused PID is never
  signalled.

Whether an identified process still lives is read from ``/proc/<pid>/stat`` (the start time
as psutil computes it); psutil, 10-25 ms of every start, is imported only by the functions that
walk process trees, environments or signal, which the prolog's start path does not call.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pwd
import signal
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence

from ._struct import Struct
from .errors import ProcError, UsageError

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:
    from typing import Any, Protocol

    import psutil

    class Child(Protocol):
        """A started child process, as ``spawn`` returns it."""

        pid: int

        def poll(self) -> int | None: ...


__all__ = [
    "Adopted",
    "Popen",
    "ProcId",
    "Result",
    "UserIds",
    "identify",
    "is_alive",
    "kill_procs",
    "lookup_user",
    "run",
    "spawn",
    "user_name",
]

log = logging.getLogger(__name__)

DEVNULL = subprocess.DEVNULL
PIPE = subprocess.PIPE
#: A started process, as ``spawn`` returns it (for annotations elsewhere).
Popen = subprocess.Popen

#: The PATH of every tool mpswrap runs for itself (hooks run with a minimal one, and a task's
#: PATH is its user's own).
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Seconds ``run`` reads what a command it killed wrote: its pipes end with its process
#: group, unless a process that left the group holds them.
KILLED_OUTPUT_WAIT = 2.0

#: Signals a supervised child starts with ignored (see launcher): Slurm and mpirun signal every
#: process of a step at once, and the supervisor must end the client through MPS first.
SHIELDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class UserIds(Struct, frozen=True):
    """Who a process runs as: names, ids and supplementary groups."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def lookup_user(who: str | int | None = None, gid: int | None = None) -> UserIds:
    """Resolve a user name or uid (default: the current user) with its groups."""
    try:
        entry = (
            pwd.getpwuid(os.geteuid() if who is None else who)
            if not isinstance(who, str)
            else pwd.getpwnam(who)
        )
    except KeyError:
        raise UsageError("unknown user", thing=str(who)) from None
    primary = entry.pw_gid if gid is None else gid
    try:
        groups = tuple(os.getgrouplist(entry.pw_name, primary))
    except OSError:
        groups = (primary,)
    return UserIds(entry.pw_name, entry.pw_uid, primary, groups, entry.pw_dir)


class Result(Struct, frozen=True):
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def _user_kwargs(user: UserIds | None) -> dict[str, object]:
    if user is None or user.uid == os.geteuid():
        return {}
    return {"user": user.uid, "group": user.gid, "extra_groups": list(user.groups)}


def _preexec(
    cpus: Iterable[int] | None,
    ignore: Sequence[int],
    cgroup_procs: int | None = None,
    user: UserIds | None = None,
) -> Callable[[], None] | None:
    """What the child does between fork and exec. With ``cgroup_procs`` (a descriptor of a
    cgroup's ``cgroup.procs``) it moves itself there while still root, then becomes ``user``:
    subprocess drops privileges before it runs this, too late for the move."""
    cpu_set = set(cpus) if cpus else None
    if not cpu_set and not ignore and cgroup_procs is None:
        return None

    def child() -> None:  # runs between fork and exec: keep it minimal
        if cgroup_procs is not None:
            os.write(cgroup_procs, b"0")
            if user is not None and user.uid != os.geteuid():
                os.setgroups(list(user.groups))
                os.setresgid(user.gid, user.gid, user.gid)
                os.setresuid(user.uid, user.uid, user.uid)
        if cpu_set:
            os.sched_setaffinity(0, cpu_set)
        for sig in ignore:
            signal.signal(sig, signal.SIG_IGN)

    return child


def _popen(argv: Sequence[str], **kwargs: object) -> subprocess.Popen[str]:
    try:
        # A program's words may come from a user (a job's name in scontrol's answer): bytes
        # that are not UTF-8 are replaced, never an error.
        return subprocess.Popen(list(argv), text=True, errors="replace", **kwargs)  # type: ignore[call-overload,no-any-return]
    except FileNotFoundError as exc:
        raise ProcError(
            "program not found",
            thing=argv[0],
            argv=list(argv),
            hint="install it or set its absolute path in the config",
        ) from exc
    except OSError as exc:  # EACCES, ENOEXEC (no #! line, not a binary), ...
        raise ProcError(
            "cannot execute program", thing=argv[0], cause=exc.strerror, argv=list(argv)
        ) from exc
    except subprocess.SubprocessError as exc:  # the child failed before exec (preexec_fn)
        raise ProcError(
            "cannot start program",
            thing=argv[0],
            argv=list(argv),
            cause="joining its cgroup, taking its user's ids, setting its CPU affinity or "
            "signal dispositions failed",
        ) from exc


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout: float,
    input: str | None = None,
    user: UserIds | None = None,
    cwd: str = "/",
    limit: int | None = None,
) -> Result:
    """Run ``argv`` to completion within ``timeout`` seconds; never raises on a non-zero exit.
    ``limit``: bytes of stdout and stderr kept at most; a program that writes more is killed
    then (what it relays may come from a socket its user controls), the same as a timeout."""
    proc = _popen(
        argv,
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **_user_kwargs(user),
    )
    try:
        if limit is None:
            out, err = proc.communicate(input, timeout=timeout)
        else:
            out, err = _communicate_capped(proc, input, timeout, limit)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        out, err = "", ""
        if limit is None:  # what it wrote before; a process that left its session and holds
            with contextlib.suppress(subprocess.TimeoutExpired):  # the pipes is not waited for
                out, err = proc.communicate(timeout=KILLED_OUTPUT_WAIT)
        for pipe in (proc.stdout, proc.stderr):  # read here, or given up on: close, reap
            if pipe is not None:
                pipe.close()
        proc.wait()
        what = "wrote too much" if exc.output == "limit" else "timed out"
        cause = (
            f"more than {limit} bytes" if exc.output == "limit" else f"no answer in {timeout:g} s"
        )
        raise ProcError(
            what,
            thing=" ".join(argv),
            cause=cause,
            argv=list(argv),
            stdout=(out or "")[:4096],
            stderr=(err or "")[:4096],
            timeout=timeout,
        ) from None
    return Result(tuple(argv), proc.returncode, out, err)


def _communicate_capped(
    proc: subprocess.Popen[str], input: str | None, timeout: float, limit: int
) -> tuple[str, str]:
    """``communicate``, keeping at most ``limit`` bytes: more raises TimeoutExpired with
    ``output="limit"`` (the caller kills the process group either way)."""
    import selectors
    import time

    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    # A program that exits without reading its input (killed: Slurm signals every process of
    # a step) breaks the pipe; its exit status tells, as with ``communicate``.
    if input:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(input)  # a command line or a few: the pipe's buffer takes it
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    end, total = time.monotonic() + timeout, 0
    with selectors.DefaultSelector() as sel:
        for fd in chunks:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = end - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            for key, _ in sel.select(left):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fd)
                total += len(data)
                if total > limit:
                    raise subprocess.TimeoutExpired(proc.args, timeout, output="limit")
                chunks[key.fd].append(data)
    proc.wait(max(0.0, end - time.monotonic()))
    texts = [
        b"".join(chunks[f.fileno()]).decode(errors="replace") for f in (proc.stdout, proc.stderr)
    ]
    proc.stdout.close()
    proc.stderr.close()
    return texts[0], texts[1]


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    user: UserIds | None = None,
    cpus: Iterable[int] | None = None,
    new_session: bool = True,
    ignore_signals: Sequence[int] = (),
    stdout: int | None = None,
    stderr: int | None = None,
    stdin: int | None = subprocess.DEVNULL,
    cwd: str | None = "/",
    cgroup: str | None = None,
) -> subprocess.Popen[str]:
    """Start ``argv`` without waiting: own session, optional user, CPU set, ignored signals
    and (as root) cgroup, the folder of a cgroup v2 the child starts in, before it execs.

    Ignored signal dispositions survive exec: that is how a supervised client is shielded
    from the SIGTERM that Slurm sends to every process of a step at once.
    """
    if cgroup is None:
        preexec, as_user = _preexec(cpus, ignore_signals), _user_kwargs(user)
    else:
        procs = _open_procs(cgroup, argv)
        preexec, as_user = _preexec(cpus, ignore_signals, procs, user), {}
    try:
        return _popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=new_session,
            close_fds=True,
            preexec_fn=preexec,
            **as_user,
        )
    finally:
        if cgroup is not None:
            os.close(procs)


def _open_procs(cgroup: str, argv: Sequence[str]) -> int:
    """A descriptor of ``<cgroup>/cgroup.procs``, for the child to move itself with."""
    try:
        return os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ProcError(
            "cannot start program in its cgroup",
            thing=argv[0],
            argv=list(argv),
            cause=f"{cgroup}: {exc.strerror or exc}",
        ) from exc


# --- identity and teardown ---------------------------------------------------------------
class ProcId(Struct, frozen=True):
    """A process identified by PID and start time (seconds since the epoch)."""

    pid: int
    start_time: float

    def to_json(self) -> dict[str, float]:
        return {"pid": self.pid, "start_time": self.start_time}


@functools.cache
@functools.cache
def _boot_time() -> float:
    with open("/proc/stat", "rb") as handle:
        for line in handle:
            if line.startswith(b"btime"):
                return float(line.split()[1])
    raise OSError("no btime line in /proc/stat")


def _parse_stat(data: bytes) -> tuple[bytes, int, float]:
    """State letter, parent PID and start time from a ``/proc/<pid>/stat`` line; the start
    time as psutil's ``create_time`` (clock ticks since boot over the tick rate, plus the
    boot time), so the two compare."""
    fields = data[data.rindex(b")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19]) / os.sysconf("SC_CLK_TCK") + _boot_time()


def _stat(pid: int) -> tuple[bytes, float] | None:
    """State letter and start time of ``pid``; None when gone or hidden from us."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state, _, start = _parse_stat(handle.read())
        return state, start
    except (OSError, ValueError, IndexError):
        return None


def identify(pid: int) -> ProcId | None:
    found = _stat(pid)
    return ProcId(pid, found[1]) if found else None


def parent_of(pid: int) -> int | None:
    """The parent PID of ``pid`` (``/proc/<pid>/stat``), None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return _parse_stat(handle.read())[1]
    except (OSError, ValueError, IndexError):
        return None


def listener_of(path: str, timeout: float = 1.0) -> tuple[int, int]:
    """The PID and UID of the process that listens on the Unix socket ``path``: the kernel's
    word (``SO_PEERCRED`` of a connection that sends nothing), whoever made the path. The real
    MPS control socket is a SOCK_SEQPACKET one, the simulator's SOCK_STREAM. A listener that
    never accepts costs ``timeout`` at most; OSError where nothing listens."""
    import errno
    import socket
    import struct

    creds = struct.Struct("3i")  # struct ucred: pid, uid, gid
    for kind in (socket.SOCK_SEQPACKET, socket.SOCK_STREAM):
        with socket.socket(socket.AF_UNIX, kind) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(path)
            except OSError as exc:
                if exc.errno == errno.EPROTOTYPE:
                    continue
                raise
            pid, uid, _ = creds.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, creds.size)
            )
            return pid, uid
    raise OSError(errno.EPROTOTYPE, f"{path}: neither a stream nor a seqpacket socket")


def adopt_orphans() -> bool:
    """Make this process a child subreaper (``PR_SET_CHILD_SUBREAPER``): a daemon that forks
    away from what we started becomes our child, so the kernel's process tree names it.
    Whether it took."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0  # 36: PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def is_alive(pid_id: ProcId) -> bool:
    """The process is there, is no zombie, and is the one identified (not a reused PID)."""
    found = _stat(pid_id.pid)
    if found is None:
        return False
    state, start = found
    return state != b"Z" and abs(start - pid_id.start_time) <= 0.05


def _process(pid_id: ProcId) -> psutil.Process | None:
    """The live process behind ``pid_id``, or None if gone, a zombie or a reused PID."""
    import psutil

    try:
        proc = psutil.Process(pid_id.pid)
        if abs(proc.create_time() - pid_id.start_time) > 0.05:
            return None  # the PID was reused by an unrelated process
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def uid_of(pid_id: ProcId) -> int | None:
    """Real uid of the identified process; None when it is gone."""
    import psutil

    proc = _process(pid_id)
    try:
        return int(proc.uids().real) if proc else None
    except psutil.Error:
        return None


def describe(pid_id: ProcId) -> str:
    """``<pid> (<command line>)`` for reports of leftovers."""
    import psutil

    proc = _process(pid_id)
    if proc is None:
        return f"{pid_id.pid} (gone)"
    try:
        cmd = " ".join(proc.cmdline()) or proc.name()
    except (psutil.Error, OSError):
        cmd = "?"
    return f"{pid_id.pid} ({cmd})"


def facts(pid: int, environ_of: int | None) -> dict[str, Any]:
    """A process for ``status``: command line, user (name and real uid), start time; its
    environment only when it runs as ``environ_of`` (never another user's) and we may read it.
    Each field on its own."""
    import psutil

    out: dict[str, Any] = {
        "cmdline": "",
        "user": None,
        "uid": None,
        "start_time": None,
        "environ": {},
    }
    try:
        proc = psutil.Process(pid)
    except psutil.Error:
        return out
    for key, read in (
        ("uid", lambda: proc.uids().real),
        ("cmdline", lambda: " ".join(proc.cmdline())),
        ("start_time", proc.create_time),
        ("user", lambda: user_name(proc.uids().real)),
    ):
        try:
            out[key] = read()
        except (psutil.Error, OSError):
            pass
    with contextlib.suppress(psutil.Error, OSError):
        if environ_of is not None and proc.uids().real == environ_of:
            out["environ"] = proc.environ()
    return out


@functools.cache
def user_name(uid: int) -> str:
    """A uid's name, asked of the user database once a process (48 clients of one user
    would ask it 48 times, over the network where users come from a directory)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def kill_procs(procs: Iterable[ProcId], sig: int = signal.SIGKILL) -> None:
    """Signal each process that is still the one we identified; never a reused PID."""
    import psutil

    for pid_id in procs:
        proc = _process(pid_id)
        if proc is None:
            continue
        try:
            proc.send_signal(sig)
            log.debug("sent signal %d to %d", sig, pid_id.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied) as exc:
            log.debug("cannot signal %d: %s", pid_id.pid, exc)


def children_of(pid: int) -> list[ProcId]:
    """Descendants of ``pid`` (recursive), identified (``descendants`` of one PID)."""
    return descendants([pid])[pid]


def process_table() -> dict[int, list[ProcId]]:
    """Each process's children by parent PID, each identified by the same reading of its
    ``stat`` that named its parent."""
    kids: dict[int, list[ProcId]] = {}
    for name in os.listdir("/proc"):
        if name.isascii() and name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    _, parent, start = _parse_stat(handle.read())
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(parent, []).append(ProcId(int(name), start))
    return kids


def descendants(
    pids: Iterable[int], table: Mapping[int, list[ProcId]] | None = None
) -> dict[int, list[ProcId]]:
    """The descendants of each of ``pids`` (recursive), from one reading of the process table
    (``table``, where the caller has one): ``children_of`` reads all of it for each PID
    (docs/benchmarks.md, ``proc_scans.py``). Each PID is taken once: PIDs reused while the
    table was read cannot make a loop."""
    kids = process_table() if table is None else table
    out: dict[int, list[ProcId]] = {}
    for pid in pids:
        found: list[ProcId] = []
        seen, todo = {pid}, list(kids.get(pid, ()))
        while todo:
            kid = todo.pop()
            if kid.pid not in seen:
                seen.add(kid.pid)
                found.append(kid)
                todo += kids.get(kid.pid, ())
        out[pid] = found
    return out


def lineage(pid: int) -> list[int]:
    """``pid`` and its ancestors' PIDs, its parent first (just ``pid`` where unreadable)."""
    import psutil

    try:
        return [pid, *(p.pid for p in psutil.Process(pid).parents())]
    except psutil.Error:
        return [pid]


def ancestor_names() -> list[str]:
    """The names of this process's ancestors, its parent first (empty where unreadable)."""
    import psutil

    try:
        return [p.name() for p in psutil.Process().parents()]
    except psutil.Error:
        return []


def _self_and_ancestors() -> set[int]:
    import psutil

    pids = {os.getpid()}
    try:
        pids.update(p.pid for p in psutil.Process().parents())
    except psutil.Error:
        pass
    return pids


def procs_mentioning(marker: str) -> list[ProcId]:
    """Processes whose command line or environment mentions ``marker`` (leftover scans).

    A job's pipe directory is unique to it, so this finds what is left of it without trusting
    names. The caller and its ancestors are skipped (they may carry the variable themselves).
    """
    import psutil

    found = []
    skip = _self_and_ancestors()
    for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
        if proc.info["pid"] in skip:
            continue
        try:
            hit = marker in " ".join(proc.info["cmdline"] or ())
            if not hit:
                hit = any(marker in v for v in proc.environ().values())
            if hit and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(ProcId(proc.info["pid"], proc.info["create_time"]))
        except (psutil.Error, OSError):
            continue
    return found


def procs_with_env(
    name: str, *more: str, among: Iterable[int] | None = None
) -> list[tuple[ProcId, dict[str, str]]]:
    """This user's processes that have the variable ``name``, with its value and those of
    ``more`` they have (the tag a supervisor gives a rank is inherited by everything the
    rank starts); only those of ``among`` where given, else all. The caller, its ancestors
    and zombies are skipped.

    Each candidate costs one read of its environment; only those that have ``name`` are read
    further. Reading every process through psutil took 0.4-0.9 s per scan on a machine of 64
    CPUs (its kernel threads are root's processes too), and a teardown scans once per GPU."""
    found = []
    skip, uid = _self_and_ancestors(), os.geteuid()
    key = os.fsencode(name) + b"="
    for pid in _owned_by(uid) if among is None else among:
        seen = None if pid in skip else _with_env(pid, key)
        if seen is not None and seen[1] == uid:
            env = seen[2]
            found.append((seen[0], {k: env[k] for k in (name, *more) if k in env}))
    return found


#: How much of a process's environment ``env_value`` reads: its owner sets its size.
ENV_VALUE_LIMIT = 256 << 10


def env_value(pid: int, name: str) -> str | None:
    """The value of variable ``name`` in ``pid``'s environment (any user's, where we may read
    it), from its first ``ENV_VALUE_LIMIT`` bytes, found without parsing the rest (a
    process's owner can make its environment megabytes long); None where it has none there,
    or is gone or unreadable."""
    key = os.fsencode(name) + b"="
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = b"\0" + handle.read(ENV_VALUE_LIMIT)
    except OSError:
        return None
    start = raw.find(b"\0" + key)
    if start < 0:
        return None
    value = raw[start + 1 + len(key) :].split(b"\0", 1)[0]
    return os.fsdecode(value)


def _owned_by(uid: int) -> list[int]:
    """The PIDs whose ``/proc`` entry ``uid`` owns: its processes, but for one that changed
    its effective user or is not dumpable (root owns that one's entry, and only root may read
    its environment); one ``stat`` each."""
    pids = []
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isascii() and entry.name.isdigit():
                try:
                    if entry.stat().st_uid == uid:
                        pids.append(int(entry.name))
                except OSError:
                    continue
    return pids


def _with_env(pid: int, key: bytes) -> tuple[ProcId, int, dict[str, str]] | None:
    """``pid``, its real user ID and its environment, where it sets the variable of ``key``
    (``NAME=``) and is no zombie; None where it does not, or cannot be read. All three are
    read through one descriptor of its ``/proc`` directory, which reads as gone once the
    process has exited, so a PID reused meanwhile is not taken for it. A name set twice has
    its first value, the one ``getenv`` (and so the CUDA driver) reads."""
    try:
        folder = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        raw = _read_at(folder, "environ")
        if not raw.startswith(key) and b"\0" + key not in raw:
            return None
        state, _, start = _parse_stat(_read_at(folder, "stat"))
        status = _read_at(folder, "status")
        uid = int(status[status.index(b"\nUid:") :].split()[1])
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(folder)
    if state == b"Z":
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            env.setdefault(os.fsdecode(name), os.fsdecode(value))
    return ProcId(pid, start), uid, env


def _read_at(folder: int, name: str) -> bytes:
    """The whole of file ``name`` in the directory of descriptor ``folder``."""
    handle = os.open(name, os.O_RDONLY, dir_fd=folder)
    try:
        chunks = []
        while chunk := os.read(handle, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(handle)


# --- a farm's children ------------------------------------------------------------------
def reap(proc: Popen[str]) -> tuple[int, float] | None:
    """(returncode, CPU seconds it and its waited-for descendants used) of a spawned child
    that has exited, reaping it (``wait4``); None while it runs. ``proc.poll()`` then gives
    the same returncode."""
    if proc.returncode is not None:
        return proc.returncode, 0.0
    try:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    except ChildProcessError:  # reaped elsewhere: Popen's own wait has the code
        return (proc.poll() or 0), 0.0
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


class Adopted(Struct):
    """A process that became our child when its parent exited (``adopt_orphans``)."""

    pid: int
    code: int | None = None

    def poll(self) -> int | None:
        """Its exit code once it has exited, reaping it; else None (a ``Child``)."""
        if self.code is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.code = 0
            else:
                self.code = os.waitstatus_to_exitcode(status) if pid else None
        return self.code


def own_children() -> set[int]:
    """The PIDs of this process's children, from the kernel's list of each of its threads
    (cheap: no walk of every process); empty where the kernel does not keep that list."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with (
                contextlib.suppress(OSError, ValueError),
                open(f"/proc/self/task/{tid}/children", "rb") as handle,
            ):
                found.update(int(p) for p in handle.read().split())
    return found


def tagged(pids: Iterable[int], name: str, prefix: str) -> dict[int, str]:
    """Of ``pids``, those whose variable ``name`` starts with ``prefix``, with its value."""
    import psutil

    out: dict[int, str] = {}
    for pid in pids:
        try:
            value = psutil.Process(pid).environ().get(name, "")
        except (psutil.Error, OSError):
            continue
        if value.startswith(prefix):
            out[pid] = value
    return out
