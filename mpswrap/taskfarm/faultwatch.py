"""Fatal GPU faults as a task farm sees them: which tasks a fault ended.

On Volta and later a fatal fault in one client ends every client of that server; the server
names the clients it hit in server.log, goes into FAULT, refuses new clients, and recovers once
they have all exited (notes: mps-facts.md). MPS does not say which client caused it, so every
task it ended is retried, the one that caused it included (bounded by ``--retries``).

A failed attempt is a victim of a fault of its GPU's server when it was alive while the
server handled it: it ended after the fault's stamp in server.log, began before the server
took clients again, and ended by then (or named by the fault). Either it had the fault's
error or it was refused. The server names the clients it hit, but a task's client may be a
child of the task (a shell line) and gone before it could be looked at; where a stamp does
not parse, the names are all there is. A task that fails on its own while its GPU's server
handles a fault is retried with the others.

Faults are known by their stamp, server and first named client, not by their place in the
log: only the log's last ``mpslog.LOG_LIMIT`` bytes are read, and older faults drop out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence

from .._struct import Struct, field
from ..jobenv import ATTEMPT_VAR, TASK_VAR
from ..mps import mpslog
from ..mps.daemon import Daemon

__all__ = ["ATTEMPT_VAR", "TASK_VAR", "FaultSeen", "FaultWatch", "is_victim"]

#: server.log's stamps have milliseconds; a failed task is reaped within a wake of its end.
STAMP_SLACK = 0.1
#: A failure counts for a fault until this long after its server took clients again.
RECOVER_SLACK = 1.0


class FaultSeen(Struct):
    """One fault of a server, as the farm tracks it."""

    key: tuple[str, int, int]  # stamp, server pid, first client named
    time: float | None  # from server.log's stamp; None if it does not parse
    pids: set[int] = field(default_factory=set)
    #: server.log says the server took clients again (its context destroyed, a client ACTIVE).
    logged_recovery: bool = False
    #: When the farm let the GPU take tasks again; None while it has not.
    recovered_at: float | None = None


def is_victim(pids: set[int], start: float, end: float, faults: Iterable[FaultSeen]) -> bool:
    """Whether an attempt that ran from ``start`` to ``end`` (as the farm saw it: its end is
    when it was reaped) with processes ``pids`` and failed was ended by one of ``faults``."""
    for fault in faults:
        if fault.time is None:
            if pids & fault.pids:
                return True
            continue
        back = fault.recovered_at
        if end < fault.time - STAMP_SLACK or (back is not None and start > back):
            continue  # gone before the fault, or begun after the server took clients again
        if pids & fault.pids or back is None or end <= back + RECOVER_SLACK:
            return True
    return False


def stamp_time(stamp: str) -> float | None:
    """Seconds since the epoch of a log stamp (``2026-11-22 06:53:48.123``, local time)."""
    try:
        whole, _, millis = stamp.partition(".")
        base = time.mktime(time.strptime(whole, "%Y-%m-%d %H:%M:%S"))
        return base + (int(millis[:3].ljust(3, "0")) / 1000 if millis.isdigit() else 0.0)
    except (ValueError, OverflowError):
        return None


class FaultWatch:
    """One GPU's server.log, read again only when it changed."""

    def __init__(self, daemon: Daemon) -> None:
        self.server_log = daemon.dirs.log / "server.log"
        self._size = self._stat()
        self.before = {_key(f) for f in mpslog.read_faults(self.server_log)}  # not the farm's
        self.seen: dict[tuple[str, int, int], FaultSeen] = {}

    def _stat(self) -> int:
        try:
            return os.stat(self.server_log).st_size
        except OSError:
            return -1

    def refresh(self) -> list[FaultSeen]:
        """The faults first seen now (those of the farm's time); the others' names and
        recovery brought up to date."""
        size = self._stat()
        if size == self._size:
            return []
        self._size = size
        new: list[FaultSeen] = []
        for fault in mpslog.read_faults(self.server_log):
            key = _key(fault)
            if key in self.before:
                continue
            seen = self.seen.get(key)
            if seen is None:
                seen = self.seen[key] = FaultSeen(key, stamp_time(fault.time))
                new.append(seen)
            seen.pids = set(fault.reported_by) | set(fault.affected)
            seen.logged_recovery = fault.recovered
        return new

    def unrecovered(self) -> Sequence[FaultSeen]:
        return [f for f in self.seen.values() if f.recovered_at is None]


def _key(fault: mpslog.Fault) -> tuple[str, int, int]:
    return fault.time, fault.server_pid, (fault.reported_by or [0])[0]
