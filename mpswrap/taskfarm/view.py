"""What ``mpswrap farm`` shows: a progress line while it runs, a summary table at the end.

On a terminal (``--progress auto``, stderr a tty) one line is redrawn at most twice a second:
``farm: 12/40 done, 1 failed, 6 running, 2 retried, ETA 1m20s``; a failure is printed above
it. Elsewhere (a batch job's output file) one plain line per finished attempt. The summary
goes to stdout: the totals, a row per GPU, and each failed task with its log.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from .engine import Counts
from .packing import Change
from .tasks import DONE, FAILED, FAULT, OOM, Task, TaskRecord

__all__ = [
    "Progress",
    "attempt_line",
    "duration",
    "eta",
    "k_line",
    "k_path",
    "state_words",
    "summary_lines",
]

#: Seconds between two redraws of the progress line.
REDRAW = 0.5
#: Failed tasks named one by one in the summary; the rest are counted.
SHOWN_FAILURES = 20


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h01m``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def eta(counts: Counts, now: float) -> float | None:
    """Seconds until every task has run, if each attempt still to come takes the mean of the
    attempts finished so far (``busy / attempts``): the work left (a task not started yet: the
    mean; a running one: the mean less the time it has run, at least 0) spread over the
    farm's places (K on each GPU); with no task waiting, the running task with most left.
    None before any attempt finished."""
    if not counts.attempts:
        return None
    mean = counts.busy / counts.attempts
    ahead = [max(0.0, mean - (now - since)) for since in counts.since]
    waiting = counts.total - counts.finished - counts.running
    if waiting <= 0:
        return max(ahead, default=0.0)
    return (waiting * mean + sum(ahead)) / max(1, counts.slots)


def state_words(counts: Counts, now: float | None = None) -> str:
    """``3/10 finished (2 done, 1 failed), 4 running, ETA 12s``: the progress line's, and
    ``farm status``'s."""
    now = time.time() if now is None else now
    text = f"{counts.finished}/{counts.total} finished ({counts.done} done, {counts.failed} failed"
    text += f", {counts.oom} oom)" if counts.oom else ")"
    text += f", {counts.running} running"
    if counts.retried:
        text += f", {counts.retried} retried"
    left = eta(counts, now)
    if left is not None and counts.finished < counts.total:
        text += f", ETA {duration(left)}"
    return text


class Progress:
    """The farm's report callback (``Farmer``'s ``report``). ``emit``: each line goes there
    instead (``mpswrap.farm()``'s log), and ``bar`` and ``auto`` mean ``lines``."""

    def __init__(
        self,
        mode: str = "auto",
        stream: TextIO | None = None,
        emit: Callable[[str], None] | None = None,
    ) -> None:
        self.stream = stream or sys.stderr
        self.emit = emit
        tty = getattr(self.stream, "isatty", lambda: False)()
        self.mode = ("bar" if tty else "lines") if mode == "auto" else mode
        if emit is not None and self.mode == "bar":
            self.mode = "lines"
        self.drawn = 0.0
        self.width = 0
        if self.mode == "bar":  # mpswrap's own log lines go above the bar, not across it
            for handler in logging.getLogger("mpswrap").handlers:
                handler.addFilter(self._clear)

    def _clear(self, record: logging.LogRecord) -> bool:
        if self.width:
            self._write("\r" + " " * self.width + "\r")
            self.width, self.drawn = 0, 0.0
        return True

    def report(self, record: TaskRecord | None, counts: Counts) -> None:
        if self.mode == "off":
            return
        if record is not None and (self.mode == "lines" or record.status != DONE):
            self._line(f"{attempt_line(record)} [{state_words(counts)}]")
        if self.mode == "bar" and time.monotonic() - self.drawn >= REDRAW:
            self._bar(f"mpswrap: farm: {state_words(counts)}")

    def note(self, text: str) -> None:
        """A line of its own (a GPU's K changed), whatever the mode but ``off``."""
        if self.mode != "off":
            self._line(text)

    def close(self) -> None:
        if self.mode == "bar" and self.width:
            self._write("\n")
            self.width = 0
        for handler in logging.getLogger("mpswrap").handlers:
            handler.removeFilter(self._clear)

    def _bar(self, text: str) -> None:
        self._write("\r" + text.ljust(self.width))
        self.width, self.drawn = len(text), time.monotonic()

    def _line(self, text: str) -> None:
        if self.emit is not None:
            self.emit(f"farm: {text}")
            return
        if self.mode == "bar" and self.width:
            self._write("\r" + " " * self.width + "\r")
            self.width = 0
        self._write(f"mpswrap: farm: {text}\n")

    def _write(self, text: str) -> None:
        """A display: its stream closed (a pipe's reader gone) must not end the farm."""
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.mode = "off"


#: What a shell's exit code says of a task line's program.
SHELL_CODES = {127: "command not found", 126: "command not executable"}


def _exit_words(code: int) -> str:
    """``exit 3``; ``exit 127: command not found``, as the task's shell meant it."""
    return f"exit {code}" + (f": {SHELL_CODES[code]}" if code in SHELL_CODES else "")


def attempt_line(record: TaskRecord) -> str:
    """``task 3 failed (exit 127: command not found) (gpu 0, 0.1 s, log ...)``."""
    code = _exit_words(record.code)
    how = {
        DONE: "done",
        FAILED: f"failed ({code})",
        FAULT: f"ended by a GPU fault ({code})",
        OOM: f"ran out of GPU memory ({code})",
    }.get(record.status, record.status)
    attempt = f" attempt {record.attempt}" if record.attempt > 1 else ""
    where = f"gpu {record.gpu_index}, {record.seconds:.1f} s"
    log = f", log {record.stderr}" if record.status != DONE else ""
    return f"task {record.task}{attempt} {how} ({where}{log})"


def _rate(change: Change) -> str:
    return "?" if change.throughput is None else f"{change.throughput:.2f}"


def k_line(gpu_index: int, before: Change, change: Change) -> str:
    """``GPU 0: K 4 -> 8 (throughput 1.90 -> 2.40 tasks/s)``: a GPU's K changed, and why."""
    if change.why == "oom":
        return f"GPU {gpu_index}: K {before.k} -> {change.k} (a task ran out of GPU memory)"
    if change.why == "memory":
        return f"GPU {gpu_index}: K {before.k} -> {change.k} (its free GPU memory takes no more)"
    rates = f"throughput {_rate(before)} -> {_rate(change)} tasks/s"
    if change.why == "hold" and change.k == before.k:
        return f"GPU {gpu_index}: K {change.k} held ({rates}: no gain past the margin)"
    if change.why == "hold":
        return f"GPU {gpu_index}: K {before.k} -> {change.k} ({rates}: no gain past the margin)"
    if change.why == "lower":
        return f"GPU {gpu_index}: K {before.k} -> {change.k} ({rates}: no gain; fewer tried)"
    return f"GPU {gpu_index}: K {before.k} -> {change.k} ({rates}{', ' + change.why})"


def k_path(history: Sequence[Change]) -> str:
    """``2 -> 4 -> 8 (hold)``: how a GPU's K went."""
    ks = [history[0].k] if history else []
    for change in history[1:]:
        if change.k != ks[-1]:
            ks.append(change.k)
    last = history[-1].why if history else ""
    return " -> ".join(map(str, ks)) + (f" ({last})" if last and last != "start" else "")


def summary_lines(
    records: Sequence[TaskRecord],
    not_run: Sequence[Task],
    skipped: int,
    counts: Counts,
    directory: str,
    *,
    packing: Mapping[int, Sequence[Change]] | None = None,
) -> list[str]:
    """The totals, a row per GPU (with how its K went: ``packing``, by GPU position), the
    failed tasks."""
    packing = packing or {}
    final = {r.task: r for r in records}  # the last attempt of each task
    waiting = {t.number for t in not_run}
    failed = [r for r in final.values() if r.status != DONE and r.task not in waiting]
    faults = sum(1 for r in records if r.status == FAULT)
    ooms = sum(1 for r in records if r.status == OOM)
    head = (
        f"farm: {counts.total + skipped} task(s): {counts.done} done, {len(failed)} failed,"
        f" {len(not_run)} not run, {skipped} done before; {faults} attempt(s) ended by a"
        f" GPU fault, {ooms} out of GPU memory; {time.time() - counts.started:.1f} s;"
        f" logs in {directory}/logs"
    )
    lines = [
        head,
        f"  {'gpu':<4} {'uuid':<40} {'attempts':>8} {'done':>5} {'failed':>6} "
        f"{'fault':>5} {'oom':>4} {'median s':>8}  K",
    ]
    for index in sorted({r.gpu_index for r in records}):
        mine = [r for r in records if r.gpu_index == index]
        took = [r.seconds for r in mine if r.status == DONE]
        median = f"{statistics.median(took):.2f}" if took else "-"
        lines.append(
            f"  {index:<4} {mine[0].gpu:<40} {len(mine):>8} "
            f"{sum(r.status == DONE for r in mine):>5} "
            f"{sum(r.status == FAILED for r in mine):>6} "
            f"{sum(r.status == FAULT for r in mine):>5} "
            f"{sum(r.status == OOM for r in mine):>4} {median:>8}  "
            f"{k_path(packing.get(index, []))}"
        )
    for record in failed[:SHOWN_FAILURES]:
        lines.append(
            f"  failed: task {record.task} ({_exit_words(record.code)}, {record.status}): "
            f"{record.command}  log: {record.stderr}"
        )
    if len(failed) > SHOWN_FAILURES:
        lines.append(f"  ... and {len(failed) - SHOWN_FAILURES} more failed (see the state file)")
    for task in not_run[:SHOWN_FAILURES]:
        lines.append(f"  not run: task {task.number}: {task.command}")
    return lines
