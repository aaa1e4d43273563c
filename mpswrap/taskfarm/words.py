"""What a farm's records say, in words: an attempt, a change of K, the counts, the summary at
the farm's end (a row per GPU, the tasks that failed with their codes and logs, those that did
not run). The progress line (``view``) and ``farm status`` (``status``) say the same words."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence

from ..errors import shown
from .fold import Tally
from .journal import DONE, FAILED, FAULT, INTERRUPTED, OOM, TIMEOUT, TaskRecord
from .packing import Change
from .tasks import Task

__all__ = [
    "attempt_line",
    "counts_words",
    "exit_words",
    "failure_words",
    "k_line",
    "k_path",
    "summary_lines",
]

#: Failed tasks named one by one in the summary; the rest are counted.
SHOWN_FAILURES = 20


#: What a shell's exit code says of a task line's program.
SHELL_CODES = {127: "command not found", 126: "command not executable", 69: "no MPS client"}


def exit_words(code: int) -> str:
    """``exit 3``; ``exit 127: command not found``, as the task's shell meant it."""
    return f"exit {code}" + (f": {SHELL_CODES[code]}" if code in SHELL_CODES else "")


def attempt_line(record: TaskRecord) -> str:
    """``task 3 failed (exit 127: command not found) (gpu 0, 0.1 s, log ...)``."""
    code = exit_words(record.code)
    how = {
        DONE: "done",
        FAILED: f"failed ({code})",
        FAULT: f"ended by a GPU fault ({code})",
        OOM: f"ran out of GPU memory ({code})",
        TIMEOUT: f"timed out ({code})",
        INTERRUPTED: "interrupted: it runs again when the farm runs again",
    }.get(record.status, record.status)
    attempt = f" attempt {record.attempt}" if record.attempt > 1 else ""
    again = ", runs again" if record.retried else ""
    where = f"gpu {record.gpu_index}, {record.seconds:.1f} s"
    log = f", log {record.stderr}" if record.status not in (DONE, INTERRUPTED) else ""
    return f"task {record.task}{attempt} {how} ({where}{log}{again})"


def _rate(change: Change) -> str:
    return "?" if change.throughput is None else f"{change.throughput:.2f}"


def k_line(gpu_index: int, before: Change, change: Change) -> str:
    """``GPU 0: K 4 -> 8 (throughput 1.90 -> 2.40 tasks/s)``: a GPU's K changed, and why."""
    moved = f"GPU {gpu_index}: K {before.k} -> {change.k}"
    fixed = {
        "oom": "a task ran out of GPU memory",
        "memory": "its free GPU memory takes no more",
        "profile": "as these tasks ran before (the farm profile)",
    }
    if change.why in fixed:
        return f"{moved} ({fixed[change.why]})"
    rates = f"throughput {_rate(before)} -> {_rate(change)} tasks/s"
    if change.why == "hold" and change.k == before.k:
        return f"GPU {gpu_index}: K {change.k} held ({rates}: no gain past the margin)"
    if change.why == "hold":
        return f"{moved} ({rates}: no gain past the margin)"
    if change.why == "lower":
        return f"{moved} ({rates}: no gain; fewer tried)"
    return f"{moved} ({rates}{', ' + change.why})"


def k_path(history: Sequence[Change]) -> str:
    """``2 -> 4 -> 8 (hold)``: how a GPU's K went."""
    ks = [history[0].k] if history else []
    for change in history[1:]:
        if change.k != ks[-1]:
            ks.append(change.k)
    last = history[-1].why if history else ""
    return " -> ".join(map(str, ks)) + (f" ({last})" if last and last != "start" else "")


def counts_words(tally: Tally, running: bool = False) -> str:
    """``12 tasks: 9 done, 1 failed, 2 not run, 0 done before``: the summary's, and
    status's (``running``: with the tasks that run)."""
    every = tally.total + tally.done_before + tally.failed_before
    words = f"{every} task{'' if every == 1 else 's'}: {tally.done} done, {tally.failed} failed"
    if tally.interrupted:
        words += f", {tally.interrupted} interrupted"
    if running or tally.now_running:
        words += f", {tally.now_running} running"
    if tally.settling:  # exited, the verdict (a fault? out of memory?) pending
        words += f", {len(tally.settling)} ending"
    words += f", {tally.not_run - tally.interrupted} not run, {tally.done_before} done before"
    return words + (f", {tally.failed_before} failed before" if tally.failed_before else "")


def summary_lines(tally: Tally, not_run: Sequence[Task], directory: str, until: float) -> list[str]:
    """The totals, a row per GPU (with how its K went), the tasks that failed and those that
    did not run; ``until``: the farm's end."""
    by_status = sum((row.statuses for row in tally.gpus.values()), start=_counter())
    head = (
        f"farm: {counts_words(tally)}; {by_status[FAULT]} attempt(s) ended by a GPU fault, "
        f"{by_status[OOM]} out of GPU memory, {by_status[TIMEOUT]} timed out; "
        f"{max(0.0, until - tally.started):.1f} s; logs in {directory}/logs"
    )
    lines = [
        head,
        f"  {'gpu':<4} {'uuid':<40} {'attempts':>8} {'done':>5} {'failed':>6} "
        f"{'fault':>5} {'oom':>4} {'median s':>8}  K",
    ]
    packing = dict(tally.packing.values())
    for index, row in sorted(tally.gpus.items()):
        s = row.statuses
        median = f"{statistics.median(row.done_s):.2f}" if row.done_s else "-"
        lines.append(
            f"  {index:<4} {row.uuid:<40} {sum(s.values()):>8} {s[DONE]:>5} "
            f"{s[FAILED] + s[TIMEOUT]:>6} {s[FAULT]:>5} {s[OOM]:>4} {median:>8}  "
            f"{k_path(packing.get(index, []))}"
        )
    failed = tally.failures()
    lines += [f"  failed: {failure_words(r)}" for r in failed[:SHOWN_FAILURES]]
    if len(failed) > SHOWN_FAILURES:
        lines.append(
            f"  ... and {len(failed) - SHOWN_FAILURES} more failed (mpswrap farm status "
            f"--failed {directory})"
        )
    lines += [
        f"  {'interrupted' if tally.settled.get(t.number) == INTERRUPTED else 'not run'}: "
        f"task {t.number}: {t.command}"
        for t in not_run[:SHOWN_FAILURES]
    ]
    return lines


def failure_words(record: TaskRecord) -> str:
    """``task 7 (exit 3, failed): CMD  log: PATH``."""
    return (
        f"task {record.task} ({exit_words(record.code)}, {record.status}): "
        f"{shown(record.command, 300)}  log: {shown(record.stderr, 300)}"
    )


def _counter() -> Counter[str]:
    return Counter()
