"""The fold of a farm's journal: what every view of a farm says, made from the journal's lines
and nothing else (``journal``).

A ``Tally`` takes the lines of one journal in order (``apply``): a ``farm`` event opens a new
run (what it had to do, who runs it), ``k`` events give each GPU's K, ``start`` events the
attempts that run, ``exit`` events those whose process ended and whose record waits for its
verdict (no longer running), each record an attempt that finished, an ``end`` event the farm's
exit code.
The engine folds each line as it writes it, so its progress line and its summary are this fold;
``farm status`` folds the same lines read back; the node's summary line and the run record
(``mpswrap metrics``) take the attempts' outcomes from it (``outcomes``). A test proves the
summary a farm printed equals the one folded from its journal.

Journal values are read, never trusted (the farm user's file): a number that is not one reads
as 0, a name is shown as ``errors.shown`` shows it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from .._struct import Struct, field
from ..errors import shown
from .journal import DONE, FAILED, FAULT, INTERRUPTED, OOM, TIMEOUT, TaskRecord, record_of
from .packing import WHYS, Change

__all__ = ["GpuRow", "Running", "Tally", "fold"]


class Running(Struct, frozen=True):
    """An attempt started and not finished (a ``start`` event without its record)."""

    task: int
    line: int
    attempt: int
    node: str
    gpu: str
    gpu_index: int
    since: float


class GpuRow(Struct):
    """One GPU's attempts, for the summary's table."""

    uuid: str
    statuses: Counter[str] = field(default_factory=Counter)
    #: Seconds of each attempt that was done (the median in the table).
    done_s: list[float] = field(default_factory=list)


class Tally(Struct):
    """A journal folded, from its last ``farm`` event on."""

    #: Tasks this run has to do (the ``farm`` event's ``todo``), done before it, places (K on
    #: each GPU), when it began, who runs it.
    total: int = 0
    done_before: int = 0
    #: Tasks that failed before and were not run again (``--skip-failed``).
    failed_before: int = 0
    slots: int = 0
    started: float = 0.0
    head: dict[str, Any] = field(default_factory=dict)
    #: The ``halt`` event's reason: the farm starts no more tasks ("": it still does).
    halted: str = ""
    #: The ``end`` event's exit code and time; None while it runs (or was killed outright).
    code: int | None = None
    ended: float | None = None
    running: dict[tuple[int, int], Running] = field(default_factory=dict)
    #: Attempts whose process ended and whose record waits for its verdict.
    settling: set[tuple[int, int]] = field(default_factory=set)
    #: The status of each task's last record that settled it (its task not retried), by task
    #: number; the record itself only where it is not done (a long farm's memory stays flat).
    settled: dict[int, str] = field(default_factory=dict)
    failed_records: dict[int, TaskRecord] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    retried: int = 0
    #: Finished attempts and the seconds they took (the ETA's mean).
    attempts: int = 0
    busy: float = 0.0
    gpus: dict[int, GpuRow] = field(default_factory=dict)
    #: Each GPU's K as it went: UUID -> (position, changes); the GPUs whose K is auto.
    packing: dict[str, tuple[int, list[Change]]] = field(default_factory=dict)
    auto: set[str] = field(default_factory=set)
    #: How the tasks ended (each its last attempt), for the node's summary: (code, attached,
    #: clients terminated) -> tasks.
    ends: Counter[tuple[int, bool | None, int]] = field(default_factory=Counter)
    #: Every record (only where asked: the API returns them; a long farm's memory stays flat).
    records: list[TaskRecord] | None = None

    def apply(self, data: dict[str, Any]) -> None:
        """One journal line."""
        kind = data.get("event")
        if kind == "farm":
            self._begin(data)
        elif kind == "start":
            self._start(data)
        elif kind == "k":
            self._k(data)
        elif kind == "exit":
            self._exit(data)
        elif kind == "halt":
            self.halted = _word(data.get("why")) or "halted"
        elif kind == "end":
            self.code = data.get("code") if type(data.get("code")) is int else None
            self.ended = _float(data.get("time"))
        elif kind is None:
            record = record_of(data)
            if record is not None:
                self.add(record)

    def add(self, record: TaskRecord) -> None:
        """A finished attempt."""
        self.running.pop((record.task, record.attempt), None)
        self.settling.discard((record.task, record.attempt))
        self.attempts += 1
        self.busy += record.seconds
        row = self.gpus.setdefault(record.gpu_index, GpuRow(_word(record.gpu)))
        row.statuses[record.status] += 1
        if record.status == DONE:
            row.done_s.append(record.seconds)
        if record.retried:
            self.retried += 1
        else:
            self.ends[(record.code, record.attached, record.terminated)] += 1
            self._settle(record.task, record)
        if self.records is not None:
            self.records.append(record)

    def _settle(self, task: int, record: TaskRecord) -> None:
        old = self.settled.get(task)
        if old is not None:
            self.statuses[old] -= 1
        self.settled[task] = record.status
        self.statuses[record.status] += 1
        if record.status == DONE:
            self.failed_records.pop(task, None)
        else:
            self.failed_records[task] = record

    def settle_by(self, settled: Mapping[str, TaskRecord]) -> None:
        """Each task this tally did not see done, as the directory's record that settles it
        says (``journal.settled``): a farm of another journal (another ``--share`` layout)
        may have run it since, as the next farm would see it."""
        for task, record in list(self.failed_records.items()):
            latest = settled.get(record.key, record)
            if latest != record:
                self._settle(task, latest)

    # --- what the views count -------------------------------------------------------------
    @property
    def done(self) -> int:
        return self.statuses[DONE]

    @property
    def failed(self) -> int:
        """Tasks that failed for good, whatever the way (exit code, fault, timeout, oom)."""
        return sum(self.statuses[s] for s in (FAILED, FAULT, OOM, TIMEOUT))

    @property
    def interrupted(self) -> int:
        return self.statuses[INTERRUPTED]

    @property
    def finished(self) -> int:
        return self.done + self.failed

    @property
    def now_running(self) -> int:
        return len(self.running)

    @property
    def not_run(self) -> int:
        """Tasks not finished and not running: waiting, or ended by a stop (run again); not
        those whose attempt waits for its verdict."""
        return max(0, self.total - self.finished - self.now_running - len(self.settling))

    @property
    def since(self) -> list[float]:
        """When each running attempt started."""
        return [r.since for r in self.running.values()]

    def failures(self) -> list[TaskRecord]:
        """The tasks that failed for good, by task number."""
        return [r for _, r in sorted(self.failed_records.items()) if r.status != INTERRUPTED]

    def attached_count(self) -> Counter[bool | None]:
        out: Counter[bool | None] = Counter()
        for (_, attached, _), n in self.ends.items():
            out[attached] += n
        return out

    # --- the events -----------------------------------------------------------------------
    def _begin(self, head: dict[str, Any]) -> None:
        self.head = head
        self.total, self.done_before = _int(head.get("todo")), _int(head.get("skipped"))
        self.failed_before = _int(head.get("failed_before"))
        self.slots, self.started = _int(head.get("slots")), _float(head.get("time"))

    def _start(self, data: dict[str, Any]) -> None:
        try:
            task = Running(
                int(data["task"]),
                _int(data.get("line")),
                int(data["attempt"]),
                _word(data.get("node", "")),
                _word(data.get("gpu", "")),
                _int(data.get("gpu_index")),
                _float(data["time"]),
            )
        except (KeyError, TypeError, ValueError, OverflowError):
            return
        self.running[(task.task, task.attempt)] = task

    def _exit(self, data: dict[str, Any]) -> None:
        key = (_int(data.get("task")), _int(data.get("attempt")))
        if self.running.pop(key, None) is not None:
            self.settling.add(key)

    def _k(self, data: dict[str, Any]) -> None:
        k = _int(data.get("k"))
        if k < 1:
            return
        rate, why = data.get("throughput"), data.get("why")
        change = Change(
            _float(data.get("t")),
            k,
            None if rate is None else _float(rate),
            why if why in WHYS else "?",
        )
        gpu = _word(data.get("gpu", ""))
        if data.get("auto") is True:
            self.auto.add(gpu)
        self.packing.setdefault(gpu, (_int(data.get("gpu_index")), []))[1].append(change)
        self.slots = sum(h[-1].k for _, h in self.packing.values() if h)


def fold(lines: Iterable[dict[str, Any]], *, keep_records: bool = False) -> Tally:
    """A journal's lines folded from its last ``farm`` event on: an earlier run's lines are
    history, and its tasks done are the new run's ``done_before`` (``keep_records``: with
    every record)."""
    lines = list(lines)
    begins = [i for i, data in enumerate(lines) if data.get("event") == "farm"]
    tally = Tally(records=[] if keep_records else None)
    for data in lines[begins[-1] if begins else 0 :]:
        tally.apply(data)
    if not begins:  # an older mpswrap's journal: its tasks are those it recorded
        tally.total = len(tally.settled)
    return tally


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: Any) -> float:
    """A finite number from the journal, else 0 (``Infinity`` and ``NaN`` parse as JSON)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if math.isfinite(value) else 0.0


def _word(value: Any) -> str:
    """A name from the journal (the farm user's file), as ``errors.shown`` shows it to
    whoever reads the status, root included."""
    return shown(str(value if value is not None else ""), 200)
