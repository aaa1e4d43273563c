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
import stat
import time
from pathlib import Path

from .. import _proc, fields
from .._cgroup import Cgroup
from .._lock import RootLock
from .._struct import Struct, asdict, field, replace
from ..fields import FieldError

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = ["Held", "RootSide", "read_held", "remove_held", "write_held"]

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

    def with_daemon(self, daemon: _proc.ProcId, settings: dict[str, Any]) -> Held:
        return replace(self, daemon=daemon, settings=settings)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["daemon"] = self.daemon.to_json() if self.daemon else None
        return {"version": VERSION, **out}


class RootSide(Struct, frozen=True):
    """Where root keeps its own state of one GPU's daemon: its lock, its record, the
    cgroup it starts the daemon in (None: no cgroup v2 it may use)."""

    lock: RootLock
    record: Path
    cgroup: Cgroup | None = None


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
    )
