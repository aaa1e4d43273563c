"""A farm directory's tasks, each counted once across its journals, whatever ``--share``
layouts wrote them (``farm status``'s totals and its failed tasks).

Task ``n`` belongs to the farm that last began with a share that picks it (the layout that
ran last, or an earlier one for the tasks no later farm covered). Its state is what the
directory's record that settles it says (``journal.settled``, as a farm run again reads
them): done or failed by that farm (or ``before`` it, when the record is older than the farm),
running or ending where a farm still runs it, else not run. The number of tasks is the task
list's, as the latest farm recorded it (``listed``); a journal of an older mpswrap gives only
its share's count, from which the list's is the least it can be.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from .fold import Tally
from .journal import DONE, FAULT, INTERRUPTED, OOM, TIMEOUT, TaskRecord, share_of

__all__ = ["Journal", "TaskTotals", "task_totals"]

#: A journal's name and its last farm, folded.
Journal = tuple[str, Tally]
#: Each state's count (``done``, ``failed``, ``oom``, ``interrupted``, ``running``, ``ending``,
#: ``not_run``, ``done_before``, ``failed_before``; ``tasks``), and the failed tasks' records.
TaskTotals = tuple[Counter[str], list[TaskRecord]]
_FAILED = (FAULT, OOM, TIMEOUT, "failed")


def task_totals(journals: Sequence[Journal], last: Mapping[str, TaskRecord]) -> TaskTotals:
    """The directory's tasks, each once (``last``: ``journal.settled`` of its journals)."""
    begun = sorted((j for j in journals if j[1].head), key=lambda j: j[1].started)
    count = _count(begun, last)
    by_number: dict[int, TaskRecord] = {}
    for record in last.values():  # an edited line's old key and new one: the latest
        old = by_number.get(record.task)
        if old is None or record.end >= old.end:
            by_number[record.task] = record
    running = {task for _, tally in journals for task, _ in tally.running}
    ending = {task for _, tally in journals for task, _ in tally.settling}
    counts: Counter[str] = Counter(tasks=count)
    failed: list[TaskRecord] = []
    for number in range(count):
        found = by_number.get(number)
        if number in running or number in ending:
            counts["running" if number in running else "ending"] += 1
        elif found is None:
            counts["not_run"] += 1
        else:
            counts[_state(found, _since(begun, number))] += 1
            counts["oom"] += found.status == OOM
            failed += [found] if found.status in _FAILED else []
    return counts, failed


def _state(record: TaskRecord, since: float) -> str:
    if record.status == INTERRUPTED:
        return "interrupted"
    before = "_before" if record.end < since else ""
    return ("done" if record.status == DONE else "failed") + before


def _since(begun: Sequence[Journal], number: int) -> float:
    """When the farm that last began with task ``number`` in its share began (0: none did)."""
    for name, tally in reversed(begun):
        if share_of(name).has(number):
            return tally.started
    return 0.0


def _count(begun: Sequence[Journal], last: Mapping[str, TaskRecord]) -> int:
    """The task list's length: as the latest farm recorded it; else the least that each
    share's count and each task's number allow."""
    listed = begun[-1][1].head.get("listed") if begun else None
    if type(listed) is int and listed >= 0:
        return listed
    least = [_least(name, tally) for name, tally in begun]
    return max([*least, *(r.task + 1 for r in last.values())], default=0)


def _least(name: str, tally: Tally) -> int:
    share, mine = share_of(name), tally.total + tally.done_before + tally.failed_before
    return (mine - 1) * share.count + share.index + 1 if mine else 0
