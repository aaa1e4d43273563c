"""A job's user-mode owners: the references its ranks hold on its daemons, and the watchdog
that acts for the owners that die without releasing.

An owner (a per-rank supervisor, ``mpswrap run``, a ``session()`` process) holds a reference
file ``refs/<pid>-<start time>`` in the job directory; a user-mode owner makes and drops it
under ``OWNER_LOCK``. The first owner starts the watchdog (``job.watchdog``, a process of its
own); a later one starts it again if the recorded one is gone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from .. import _lock, _proc
from ..errors import LayoutError
from ..jobenv import TREE_VAR
from ..mps.manifest import Manifest
from ..paths import JobLayout, read_job_file

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = [
    "OWNER_LOCK",
    "add_ref",
    "counted_ref",
    "dir_identity",
    "ensure_watchdog",
    "live_refs",
    "owner_lock",
]

log = logging.getLogger(__name__)

OWNER_LOCK = ".owner.lock"
WATCHDOG_PID = "watchdog.pid"
_WATCHDOGS: list[Any] = []  # their Popen objects: they outlive the call that started them


def add_ref(layout: JobLayout) -> Path:
    me = _proc.identify(os.getpid())
    assert me is not None
    layout.refs_dir.mkdir(mode=0o700, exist_ok=True)
    ref = layout.refs_dir / f"{me.pid}-{me.start_time:.3f}"
    ref.touch()
    return ref


def counted_ref(layout: JobLayout) -> Path | None:
    """A reference to the prolog's daemons; None (and a warning) where the job directory
    takes none: the rank then runs as if alone on its node. Without the owner lock: a ref
    made while the last rank sums up belongs to the next summary, and the rank, which may run
    for days, does not load filelock (4 MiB) before its program ends. Only in a job directory
    of this process's own user: root (``srun --jobid`` into a user's job) never writes there."""
    try:
        if os.lstat(layout.job_dir).st_uid != os.geteuid():
            log.debug("summary: %s is another user's: this rank is not counted", layout.job_dir)
            return None
        return add_ref(layout)
    except OSError as exc:
        log.warning("summary: this rank is not counted with the node's others (%s)", exc)
        return None


def live_refs(layout: JobLayout) -> list[_proc.ProcId]:
    """Owners whose reference is live (same PID and start time); stale ones are removed."""
    try:
        refs = list(layout.refs_dir.iterdir())
    except FileNotFoundError:
        return []
    live = []
    for ref in refs:
        owner = _owner_of(ref)
        if owner is not None and _proc.is_alive(owner):
            live.append(owner)
        elif owner is not None:
            ref.unlink(missing_ok=True)
    return live


def _owner_of(ref: Path) -> _proc.ProcId | None:
    pid_text, _, start_text = ref.name.partition("-")
    try:
        return _proc.ProcId(int(pid_text), float(start_text))
    except ValueError:
        return None


def dir_identity(path: Path) -> tuple[int, int] | None:
    """A directory by device and inode (None if it is gone): a path made again after a
    cleaner removed it is another directory, without the daemons' sockets."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@contextlib.contextmanager
def owner_lock(job_dir: Path, timeout: float) -> Iterator[tuple[int, int] | None]:
    """Hold the job directory's ``OWNER_LOCK``: the directory's identity, or None where the
    directory is gone (before the lock was had, or while it was awaited: the owner that held
    it removed it). Taken on the directory held open (``_lock.DirLock``), never on its path:
    a lock on a path makes a removed directory again."""
    try:
        fd = os.open(job_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield None
        return
    try:
        held = os.fstat(fd)
        lock = _lock.DirLock(fd, job_dir / OWNER_LOCK, timeout)
        try:
            lock.acquire()
        except LayoutError:
            if dir_identity(job_dir) == (held.st_dev, held.st_ino):
                raise  # the directory is there: another cause
            yield None  # removed: its lock file could not be made
            return
        try:  # where the path names another directory now, this one was removed
            same = dir_identity(job_dir) == (held.st_dev, held.st_ino)
            yield (held.st_dev, held.st_ino) if same else None
        finally:
            lock.release()
    finally:
        os.close(fd)


def ensure_watchdog(
    layout: JobLayout, dir_id: tuple[int, int], manifests: Sequence[Manifest]
) -> None:
    """Start the job's watchdog unless a live one is recorded. It is handed what this owner
    has seen (the directory's identity, the daemons, the live owners): a cleaner that removes
    the directory before the watchdog has looked at it then still leaves it something to end."""
    pid_file = layout.job_dir / WATCHDOG_PID
    pid_text, _, start_text = (read_job_file(pid_file, 64) or "").partition(" ")
    with contextlib.suppress(ValueError):
        if _proc.is_alive(_proc.ProcId(int(pid_text), float(start_text))):
            return
    seen = {
        "dir": list(dir_id),
        "daemons": [m.daemon.to_json() for m in manifests],
        "owners": [o.to_json() for o in live_refs(layout)],
    }
    argv = [sys.executable, "-m", "mpswrap.job.watchdog", str(layout.job_dir), json.dumps(seen)]
    env: Mapping[str, str] = {
        **{
            k: v
            for k, v in os.environ.items()
            if k.startswith(("MPSWRAP_", "PATH", "HOME")) and k != TREE_VAR
        },  # not a rank's
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    # stdio away from the caller's: srun and test runners wait for EOF on their pipes.
    child = _proc.spawn(
        argv, env=env, stdout=_proc.DEVNULL, stderr=_proc.DEVNULL, ignore_signals=_proc.SHIELDED
    )
    _WATCHDOGS.append(child)
    ident = _proc.identify(child.pid)
    with contextlib.suppress(OSError):  # the directory gone: the watchdog knows it by SEEN
        if ident:
            pid_file.write_text(f"{ident.pid} {ident.start_time}")
