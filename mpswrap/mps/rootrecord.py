"""Root's own record of the daemons it starts (DESIGN.md, Trust: root's record of a job).

Per GPU of a job: who the daemon is (PID and start time), the cgroup it and its servers run
in, the GPU and the job user it serves, as root started them. It lives beside root's locks
(``<run_dir>/.locks``, root's, mode 0700), where no job user can write: the teardown, and
root's ``stop``, ``status`` and ``metrics``, take identity from here and from the cgroup, never
from the manifest, pid file, logs, environment or control socket in the job user's
directories, which stay for users and user mode and are read as hints only.

A record is written before the daemon starts (its cgroup, the daemon not known yet) and again
once the daemon answers, so a teardown racing a failed start still finds the cgroup.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
import time
from pathlib import Path

from .. import _proc, fields
from .._cgroup import Cgroup
from .._lock import RootLock
from .._struct import Struct, asdict, field
from ..errors import LayoutError
from ..fields import FieldError
from ..paths import ROOT_ONLY, ensure_shared_dir

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = [
    "PIPE_NAMES",
    "Held",
    "RootSide",
    "pin_control",
    "pinned_control",
    "read_held",
    "remove_held",
    "unpin",
    "write_held",
]

log = logging.getLogger(__name__)

VERSION = 1
#: A record is a few hundred bytes.
LIMIT = 64 << 10
SUFFIX = ".held.json"


class Held(Struct):
    """What root started for one GPU of a job."""

    key: str
    gpu_uuid: str
    uid: int
    gid: int
    user: str
    started_by: str
    #: The cgroup folder the daemon runs in; None where no cgroup v2 was writable.
    cgroup: str | None = None
    #: The daemon, once it answered; None before.
    daemon: _proc.ProcId | None = None
    cpus: list[int] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    #: The daemon's control socket as root pinned it once the daemon answered
    #: (``pin_control``): the pinned folder's name and the socket's (device, inode); ``pin``
    #: is ``""`` where it could not be pinned (root then sends the daemon no command), None
    #: before.
    pin: str | None = None
    socket: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["daemon"] = self.daemon.to_json() if self.daemon else None
        out["socket"] = list(self.socket) if self.socket else None
        return {"version": VERSION, **out}


class RootSide(Struct, frozen=True):
    """Where root keeps its own state of one GPU's daemon: its lock, its record, the
    cgroup it starts the daemon in (None: no cgroup v2 it may use), and the folder of root's
    through which root's control commands reach the daemon (``pin_control``)."""

    lock: RootLock
    record: Path
    cgroup: Cgroup | None = None
    control: Path | None = None


#: The names a control program may use in the daemon's pipe directory (mps-facts.md): what
#: root's pinned folder holds of it (not the pid file: a job file of one link stays one).
PIPE_NAMES = frozenset({"control", "control_privileged", "control_lock", "log"})


def pin_control(
    pipe: Path, pins: Path, uid: int, daemon: int
) -> tuple[str, tuple[int, int]] | None:
    """Hard-link the daemon's control socket (and the other names of ``PIPE_NAMES`` it made)
    from the job user's ``pipe`` into a new folder of root's below ``pins``, just after the
    daemon answered there. Root's control commands (sent as the job user) then go through
    that folder: a socket the job user later swaps in the pipe directory (a link to another
    job's daemon, a relay of its own) is never the one they reach. What is pinned is the
    socket the daemon (PID ``daemon``, which root knows from its cgroup) listens on, as the
    kernel says: one the job user swapped in before the pin is refused. ``pins`` is root's
    and mode 0711, the folder's name random: no other user can list it or guess the name, so
    the pinned socket is reachable by no one the job's 0700 pipe directory keeps out. The
    folder's name and the socket's (device, inode); None, with a warning, where the pipe
    holds no socket of the daemon's (root then sends the daemon no command at all)."""
    from ..removal import remove_tree

    where = pins / secrets.token_hex(8)
    try:
        ensure_shared_dir(pins, ROOT_ONLY, mode=0o711)
        ensure_shared_dir(where, ROOT_ONLY, mode=0o755)  # as the job user's pipe is to them
        folder = os.lstat(pipe)
        if not stat.S_ISDIR(folder.st_mode) or folder.st_uid != uid:
            raise OSError(f"{pipe} is not a directory of uid {uid}")
        for entry in os.scandir(pipe):
            info = entry.stat(follow_symlinks=False)
            kind = stat.S_IFMT(info.st_mode)
            linkable = kind in (stat.S_IFSOCK, stat.S_IFREG, stat.S_IFIFO) and info.st_uid == uid
            if entry.name in PIPE_NAMES and linkable:
                os.link(entry.path, where / entry.name, follow_symlinks=False)
        st = os.lstat(where / "control")
        # The daemon's socket has its one name in the pipe (and now root's): one more is a
        # hard link the job user made to another socket (another job's, pinned there too).
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != uid or st.st_nlink != 2:
            raise OSError(f"not a socket of uid {uid} with one name in {pipe}")
        listener = _proc.listener_of(str(where / "control"))
        if listener != (daemon, uid):
            raise OSError(f"its listener is PID {listener[0]}, not the daemon's {daemon}")
    except (OSError, LayoutError) as exc:
        why = exc.line() if isinstance(exc, LayoutError) else exc.strerror or exc
        log.warning(
            "cannot pin the control socket of %s (%s): root will end its daemon by signal",
            pipe,
            why,
        )
        remove_tree(where)
        return None
    return where.name, (st.st_dev, st.st_ino)


def pinned_control(side: RootSide, held: Held | None) -> Path | None:
    """Where root's control commands go: the pinned folder the record names, where it still
    holds the socket pinned there; else a path that names nothing (no command reaches any
    daemon: the teardown ends it through its cgroup or record). None where root pinned
    nothing (a daemon not answering yet, a record of an older mpswrap): the pipe."""
    if held is None or held.pin is None or side.control is None:
        return None
    nowhere = side.control / "not-pinned"
    if not held.pin or held.socket is None:
        return nowhere
    where = side.control / held.pin
    try:
        folder, st = os.lstat(where), os.lstat(where / "control")
    except OSError:
        return nowhere
    pinned = (st.st_dev, st.st_ino) == held.socket
    if not stat.S_ISDIR(folder.st_mode) or folder.st_uid != 0 or not pinned:
        log.warning("%s: root's pinned control socket is not the daemon's", held.key)
        return nowhere
    return where


def unpin(side: RootSide, held: Held | None) -> None:
    """The pinned folder the record names, removed (with the record)."""
    from ..removal import remove_tree

    if held is not None and held.pin and side.control is not None:
        remove_tree(side.control / held.pin)


def record_path(lock: Path) -> Path:
    """The record beside the lock ``<node>.<job>.<key>[.u<uid>].lock``."""
    return lock.with_name(lock.name.removesuffix(".lock") + SUFFIX)


def write_held(path: Path, held: Held) -> None:
    """Replace the record whole (a new file of root's, mode 0600, renamed over it)."""
    tmp = path.with_name(f".{path.name}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with open(fd, "w", encoding="utf-8") as handle:
            json.dump(held.to_json(), handle)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_held(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def read_held(path: Path) -> Held | None:
    """The record at ``path``; None when absent. Root's own file, still read as a record of
    root's must be: a regular file of root's of one link, no larger than ``LIMIT``, every
    field of its type; anything else is named in a warning and read as absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("not reading root's record %s: %s", path, exc.strerror)
        return None
    with open(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_nlink != 1:
            log.warning("not reading root's record %s: not a file of root's", path)
            return None
        data = handle.read(LIMIT + 1)
    try:
        return _parse(json.loads(data[:LIMIT]))
    except (ValueError, KeyError, AttributeError, RecursionError) as exc:
        log.warning("not reading root's record %s: %s", path, exc)
        return None


def _parse(data: Any) -> Held:
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise FieldError("not a record of this version")
    daemon = data.get("daemon")
    cgroup = data.get("cgroup")
    socket, pin = data.get("socket"), data.get("pin")
    return Held(
        key=fields.text(data["key"], 8),
        gpu_uuid=fields.text(data["gpu_uuid"], 256),
        uid=fields.whole(data["uid"]),
        gid=fields.whole(data["gid"]),
        user=fields.text(data["user"], 256),
        started_by=fields.text(data["started_by"], 16),
        cgroup=None if cgroup is None else fields.text(cgroup),
        daemon=None
        if daemon is None
        else _proc.ProcId(fields.pid(daemon["pid"]), fields.number(daemon["start_time"])),
        cpus=[fields.whole(c, 1 << 16) for c in fields.items(data.get("cpus", []))],
        settings=dict(data.get("settings") or {}),
        started=fields.number(data.get("started", 0)),
        pin=None if pin is None else _pin(pin),
        socket=None if socket is None else _socket(socket),
    )


def _pin(value: Any) -> str:
    name = fields.text(value, 64)
    if name and not name.isalnum():
        raise FieldError("not a pinned folder's name")
    return name


def _socket(value: Any) -> tuple[int, int]:
    device, inode = fields.items(value)
    return fields.whole(device, 1 << 64), fields.whole(inode, 1 << 64)
