"""Recording a farm: each thing that happens becomes a journal line, and every view is told of
it through the fold of those lines (``fold.Tally``), never from a count of its own.

The recorder writes a line (``journal.FarmDir.write``), folds the same line into the farm's
tally, writes the attempt's joblog line (``joblog``), and at the end of each wake of the engine
(``flush``) shows what finished in that wake with the counts as they are then, the tasks just
started included (``view.Progress``), and hands the attempts' outcomes to the run record, one
write a second at most (``job.run.Run.ended``: ``mpswrap status`` and ``metrics`` read it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import _proc
from ..job.outcomes import Outcome
from .fold import Tally
from .joblog import Joblog
from .journal import INTERRUPTED, FarmDir, TaskRecord, as_line
from .lanes import Attempt, Lane
from .packing import Change
from .tasks import Task

__all__ = ["Recorder", "View"]

#: Seconds between two writes to the run record (one file each: ``mpswrap status`` and
#: ``metrics`` read it while the farm runs).
RECORD_EVERY = 1.0


class View:
    """What the recorder tells: finished attempts with the tally (each wake), a note (a K
    changed). The engine's default shows nothing (calibrate)."""

    def report(self, records: Sequence[TaskRecord], tally: Tally) -> None:
        """Attempts that finished in a wake, and where the farm stands after it."""

    def note(self, lane: Lane, before: Change, change: Change) -> None:
        """A GPU's K changed."""


class Recorder:
    """The farm's journal, joblog and views, for one run of a share."""

    def __init__(
        self,
        farm_dir: FarmDir,
        node: str,
        *,
        view: View | None = None,
        ended: Callable[..., None] | None = None,
        keep_records: bool = False,
    ) -> None:
        self.dir, self.node = farm_dir, node
        self.view = view or View()
        #: The run record (``Run.ended``): the outcomes of each wake's attempts.
        self.ended = ended
        self.tally = Tally(records=[] if keep_records else None)
        self.joblog: Joblog | None = None
        self._new: list[TaskRecord] = []
        self._unsaved: list[TaskRecord] = []
        self._saved_at = 0.0

    def _write(self, data: dict[str, Any]) -> None:
        self.dir.write(data)
        self.tally.apply(data)

    def begin(self, todo: int, skipped: int, slots: int, **facts: Any) -> None:
        """The ``farm`` event: who runs this share now, and what it has to do."""
        me = _proc.identify(os.getpid())
        self.joblog = Joblog(self.dir.joblog_path)
        self._write(
            {
                "event": "farm",
                "time": time.time(),
                "node": self.node,
                "pid": os.getpid(),
                "pid_start": me.start_time if me else 0.0,
                "share": str(self.dir.share),
                "todo": todo,
                "skipped": skipped,
                "slots": slots,
                **facts,
            }
        )

    def k(self, lane: Lane, change: Change) -> None:
        """A GPU's K: where it starts, and each change (shown as a note but the start)."""
        assert lane.packing is not None
        history = lane.packing.history
        before = history[-2] if len(history) > 1 else change
        self._write(
            {
                "event": "k",
                "gpu": lane.slot.uuid,
                "gpu_index": lane.number,
                "node": self.node,
                "auto": lane.packing.auto,
                **change.to_json(),
            }
        )
        if change.why != "start":
            self.view.note(lane, before, change)

    def start(self, attempt: Attempt) -> None:
        task, lane = attempt.task, attempt.lane
        self._write(
            {
                "event": "start",
                "task": task.number,
                "key": task.key,
                "line": task.line,
                "attempt": attempt.number,
                "node": self.node,
                "gpu": lane.slot.uuid,
                "gpu_index": lane.number,
                "time": attempt.start,
            }
        )

    def halted(self, why: str) -> None:
        """The farm starts no more tasks (``--halt``, a signal): those not run stay so."""
        self._write({"event": "halt", "time": time.time(), "why": why})

    def exited(self, attempt: Attempt) -> None:
        """A failed attempt's process ended; its record waits for the verdict (a GPU fault?
        out of memory?): from here on it no longer runs."""
        self._write(
            {
                "event": "exit",
                "task": attempt.task.number,
                "attempt": attempt.number,
                "time": attempt.end,
            }
        )

    def finish(self, attempt: Attempt, status: str, *, retried: bool = False) -> TaskRecord:
        """A finished attempt's record."""
        return self.record(
            attempt.task,
            attempt.number,
            attempt.lane,
            status=status,
            code=attempt.code,
            span=(attempt.start, attempt.end),
            retried=retried,
            attached=attempt.attached,
            signal=attempt.signal,
            terminated=attempt.rank.ended,
        )

    def record(
        self,
        task: Task,
        number: int,
        lane: Lane,
        *,
        status: str,
        code: int,
        span: tuple[float, float],
        retried: bool = False,
        attached: bool | None = None,
        signal: int = 0,
        terminated: int = 0,
    ) -> TaskRecord:
        out, err = self.dir.log_paths(task, number)
        record = TaskRecord(
            task.number,
            task.key,
            task.command,
            number,
            status,
            code,
            self.node,
            lane.slot.uuid,
            lane.number,
            span[0],
            span[1],
            str(out),
            str(err),
            retried,
            attached,
            signal,
            terminated,
        )
        self._write(as_line(record))
        # parallel's: a line per task once settled (an interrupted one runs again on resume)
        if self.joblog is not None and not retried and status != INTERRUPTED:
            self.joblog.add(record)
        self._new.append(record)
        return record

    def flush(self, final: bool = False) -> None:
        """The end of a wake: the views told what finished in it; the run record, at most
        every ``RECORD_EVERY`` seconds (``final``: now), what finished since it was told."""
        new, self._new = self._new, []
        self.view.report(new, self.tally)
        self._unsaved += new
        now = time.monotonic()
        if self.ended is not None and self._unsaved and (final or now >= self._saved_at):
            self.ended(*(outcome_of(r) for r in self._unsaved if not r.retried))
            self._unsaved, self._saved_at = [], now + RECORD_EVERY

    def end(self, code: int, when: float) -> None:
        """The ``end`` event (``when``: the summary's end); the journal and joblog closed."""
        try:
            self._write({"event": "end", "time": when, "code": code})
        finally:
            self.close()

    def close(self) -> None:
        self.dir.close()
        if self.joblog is not None:
            self.joblog.close()
            self.joblog = None


def outcome_of(record: TaskRecord) -> Outcome:
    """A task's last attempt as the run record's outcome (the node's summary line,
    ``metrics``): a task retried is one outcome, its last attempt's. One whose clients
    terminate_client ended was a client, whether or not a check had listed it yet."""
    attached = True if record.terminated else record.attached
    return Outcome(record.code, attached, record.terminated, record.start)


def outcomes(tally: Tally) -> list[Outcome]:
    """The tally's tasks as outcomes, each its last attempt's (the node's summary line of a
    farm: tasks, as the farm's own summary counts them)."""
    return [
        Outcome(code, True if terminated else attached, terminated, tally.started)
        for (code, attached, terminated), n in sorted(tally.ends.items(), key=str)
        for _ in range(n)
    ]
