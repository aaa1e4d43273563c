"""Fatal GPU faults as a task farm sees them: which tasks a fault ended.

On Volta and later a fatal fault in one client ends every client of that server; the server
names the clients it hit in server.log, goes into FAULT, refuses new clients, and recovers once
they have all exited (notes: mps-facts.md). MPS does not say which client caused it, so every
task it ended is retried, the one that caused it included (bounded by ``--retries``).

A failed attempt is a victim of a fault of its GPU's server when it was alive while the
server handled it: it ended after the fault's stamp in server.log and started before the
server took clients again (it either had the fault's error or was refused). The server names
the clients it hit, but a task's client may be a child of the task (a shell line) and gone
before it could be looked at; where a stamp does not parse, the names are all there is. A task
that fails on its own while its GPU's server handles a fault is retried with the others.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..mps import mpslog
from ..mps.daemon import Daemon

__all__ = ["FaultSeen", "FaultWatch", "is_victim"]

#: server.log's stamps have milliseconds.
STAMP_SLACK = 0.01
#: Every task's number and attempt, in its environment.
TASK_VAR, ATTEMPT_VAR = "MPSWRAP_TASK", "MPSWRAP_TASK_ATTEMPT"


@dataclass
class FaultSeen:
    """One fault of a server, as the farm tracks it."""

    time: float | None  # from server.log's stamp; None if it does not parse
    pids: set[int] = field(default_factory=set)
    #: When the server took clients again (the farm's view); None while it has not.
    recovered_at: float | None = None


def is_victim(pids: set[int], start: float, end: float, faults: Iterable[FaultSeen]) -> bool:
    """Whether an attempt that ran from ``start`` to ``end`` (as the farm saw it: its end is
    when it was reaped) with processes ``pids`` and failed was ended by one of ``faults``."""
    for fault in faults:
        if pids & fault.pids:
            return True
        if fault.time is None:
            continue
        recovered = fault.recovered_at
        if end >= fault.time - STAMP_SLACK and (recovered is None or start <= recovered):
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
        self._sizes: dict[Path, int] = {}
        self._faults: list[mpslog.Fault] = []
        self._changed(self.server_log)
        self.before = len(mpslog.read_faults(self.server_log))  # not the farm's
        self.seen: list[FaultSeen] = []

    def _changed(self, path: Path) -> bool:
        try:
            size = os.stat(path).st_size
        except OSError:
            size = -1
        changed = self._sizes.get(path) != size
        self._sizes[path] = size
        return changed

    def refresh(self) -> list[FaultSeen]:
        """The faults since the farm started; the ones first seen now are returned."""
        if not self._changed(self.server_log):
            return []
        faults = mpslog.read_faults(self.server_log)[self.before :]
        new: list[FaultSeen] = []
        for index, fault in enumerate(faults):
            if index == len(self.seen):
                self.seen.append(FaultSeen(stamp_time(fault.time)))
                new.append(self.seen[-1])
            self.seen[index].pids = set(fault.reported_by) | set(fault.affected)
        return new

    def unrecovered(self) -> Sequence[FaultSeen]:
        return [f for f in self.seen if f.recovered_at is None]
