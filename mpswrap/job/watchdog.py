"""The owner watchdog: stops a job's user-mode daemons once every owner has gone.

Started by the first owner (``job.owners.ensure_watchdog``) as
``python -m mpswrap.job.watchdog JOB_DIR SEEN``, SEEN being what that owner saw (JSON: the
directory's device and inode, the daemons' and the live owners' identities), so that it has
them even if the directory goes before it looks.
Owners that die without releasing (``MPI_Abort``, SIGKILL, the OOM killer) leave stale
references; once none is live for ``WATCH_GRACE`` seconds, the watchdog stops the daemons. If
the job directory goes away under running daemons (a tmp cleaner, a logout removing
``$XDG_RUNTIME_DIR``), no socket is left to quit them through: once the owners it saw are
gone too, and no other process names the directory (clients of an owner that joined after
the watchdog's start, whose reference went with the directory), it ends the daemons and their
servers by identity.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from .. import _proc
from .._struct import Struct
from .._wait import end_procs
from ..config import Settings, load_settings
from ..errors import MpswrapError
from ..paths import JobLayout
from .job import JobDaemons
from .owners import dir_identity, live_refs, owner_lock

__all__ = ["Seen", "watchdog"]

log = logging.getLogger(__name__)

#: How often the watchdog looks at the owners, and how long all must be gone before it acts.
WATCH_INTERVAL = 0.5
WATCH_GRACE = 2.0


class Seen(Struct, frozen=True):
    """What the owner that started the watchdog saw of the job."""

    #: The directory by identity (device, inode): a lock taken by a rank's teardown may make
    #: its path again after a cleaner removed it, but the daemons' sockets went with the first.
    dir: tuple[int, int]
    daemons: list[_proc.ProcId]
    owners: list[_proc.ProcId]

    @classmethod
    def from_json(cls, text: str) -> Seen:
        data = json.loads(text)
        dev, ino = data["dir"]
        return cls(
            (int(dev), int(ino)),
            [_proc.ProcId(**p) for p in data["daemons"]],
            [_proc.ProcId(**p) for p in data["owners"]],
        )

    @classmethod
    def now(cls, layout: JobLayout, settings: Settings) -> Seen:
        """What is there now: for a watchdog started by hand, without SEEN."""
        return cls(
            dir_identity(layout.job_dir) or (-1, -1),
            _daemons_of(layout, settings),
            live_refs(layout),
        )


def watchdog(job_dir: Path, seen_text: str | None = None) -> int:
    """Stop the user-mode daemons of ``job_dir`` once every owner has gone."""
    # A user-mode tree of this process's own user (root's own too: never root's record).
    layout = JobLayout(job_dir.parent.parent, job_dir.parent.name, job_dir.name, os.geteuid())
    settings = load_settings()
    seen = Seen.from_json(seen_text) if seen_text else Seen.now(layout, settings)
    gone_since: float | None = None
    daemons, owners = seen.daemons, seen.owners
    while dir_identity(layout.job_dir) == seen.dir:
        daemons = _daemons_of(layout, settings) or daemons
        live = live_refs(layout)
        owners = live or owners
        if live:
            gone_since = None
        elif gone_since is None:
            gone_since = time.monotonic()
        elif time.monotonic() - gone_since >= WATCH_GRACE and _stop_if_ownerless(
            layout, seen, settings
        ):
            return 0
        time.sleep(WATCH_INTERVAL)
    daemons = [d for d in daemons if _proc.is_alive(d)]
    while daemons and (any(_proc.is_alive(o) for o in owners) or _users_left(layout, daemons)):
        time.sleep(WATCH_INTERVAL)
    _kill_orphaned(daemons)
    return 0


def _stop_if_ownerless(layout: JobLayout, seen: Seen, settings: Settings) -> bool:
    """Stop the daemons through their sockets unless an owner is back, or the directory went
    (the caller's loop then sees another directory, or none)."""
    with owner_lock(layout.job_dir, 30) as held:
        if held != seen.dir or live_refs(layout):
            return False
        JobDaemons(layout, settings).stop()
        return True


def _users_left(layout: JobLayout, daemons: list[_proc.ProcId]) -> bool:
    """Processes besides the daemons and their servers that still name the job directory:
    clients of an owner that joined after the watchdog's start (SEEN does not name it)."""
    ours = {d.pid for d in daemons} | {s.pid for d in daemons for s in _proc.children_of(d.pid)}
    return any(p.pid not in ours for p in _proc.procs_mentioning(f"{layout.job_dir}/"))


def _daemons_of(layout: JobLayout, settings: Settings) -> list[_proc.ProcId]:
    """The job's daemons by identity, while their manifests can still be read."""
    try:
        manifests = JobDaemons(layout, settings).manifests()
    except MpswrapError:
        return []
    return [m.daemon for m in manifests]


def _kill_orphaned(daemons: list[_proc.ProcId]) -> None:
    """No socket is left to quit them through: kill the daemons and their servers (a bounded
    wait for them to be gone)."""
    doomed: list[_proc.ProcId] = []
    for daemon in (d for d in daemons if _proc.is_alive(d)):
        servers = _proc.children_of(daemon.pid)
        log.warning(
            "job directory gone: killing MPS daemon %d and servers %s",
            daemon.pid,
            [s.pid for s in servers],
        )
        doomed += [daemon, *servers]
    end_procs(doomed, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(watchdog(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None))
