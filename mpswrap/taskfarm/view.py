"""What ``mpswrap farm`` shows, all of it from the fold of its journal (``fold.Tally``): a
progress line while it runs, a summary at the end.

On a terminal (``--progress auto``, stderr a tty) one line is redrawn at most twice a second:
``farm: 12/40 finished (11 done, 1 failed), 6 running, 2 retried, ETA 1m20s``; a failure is
printed above it, and the line is ended before anything else is printed after it. Elsewhere
(a batch job's output file) one plain line per finished attempt, and every ``--heartbeat``
seconds (60 by default) without one a line of where the farm stands, so that a log shows the
farm alive. ``quiet`` (``-q``) shows the failures only. The summary goes to stdout: the
totals, a row per GPU, and each failed task with its code and log.

The ETA: the mean of the attempts finished so far is what a task takes (before any finished,
the longest a running task has run: a task takes at least that); a running task has the mean
less its age left, or, once it outlived the mean, as long again as it ran; the work left is
spread over the farm's places (K on each GPU); with none waiting, the running task with most
left.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TextIO

from ..errors import shown
from .fold import Tally
from .journal import DONE, FAILED, FAULT, INTERRUPTED, OOM, TIMEOUT, TaskRecord
from .lanes import Lane
from .packing import Change
from .recorder import View
from .tasks import Task

__all__ = [
    "HEARTBEAT",
    "Progress",
    "attempt_line",
    "duration",
    "eta",
    "exit_words",
    "k_line",
    "k_path",
    "state_words",
    "summary_lines",
]

#: Seconds between two redraws of the progress line.
REDRAW = 0.5
#: Seconds without a line, when the output is no terminal, before one says where it stands.
HEARTBEAT = 60.0
#: Failed tasks named one by one in the summary; the rest are counted.
SHOWN_FAILURES = 20
#: What the ETA's estimate is, for ``farm status --json``.
ETA_RULE = (
    "mean time of the finished attempts (before any: the longest running one's age); each "
    "task not started takes the mean, each running one the mean less its age (once past the "
    "mean: its age again); spread over K x GPUs places"
)


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h01m``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def mean_attempt(tally: Tally, now: float) -> float | None:
    """What a task takes, as the ETA counts it (module's text); None: nothing to go by."""
    if tally.attempts:
        return tally.busy / tally.attempts
    ages = [now - since for since in tally.since]
    return max(ages) if ages else None


def eta(tally: Tally, now: float) -> float | None:
    """Seconds until every task has run (module's text); None with nothing to go by."""
    mean = mean_attempt(tally, now)
    if mean is None:
        return None
    ahead = [_left(mean, now - since) for since in tally.since]
    if tally.not_run <= 0:
        return max(ahead, default=0.0)
    return (tally.not_run * mean + sum(ahead)) / max(1, tally.slots)


def _left(mean: float, age: float) -> float:
    return mean - age if age < mean else max(age, 1.0)


def state_words(tally: Tally, now: float) -> str:
    """``3/10 finished (2 done, 1 failed), 4 running, ETA 12s``: the progress line's, and
    ``farm status``'s."""
    text = f"{tally.finished}/{tally.total} finished ({tally.done} done, {tally.failed} failed"
    text += f", {tally.interrupted} interrupted)" if tally.interrupted else ")"
    text += f", {tally.now_running} running"
    if tally.retried:
        text += f", {tally.retried} retried"
    left = eta(tally, now)
    if left is not None and tally.finished < tally.total:
        text += f", ETA {duration(left)}"
    return text


class Progress(View):
    """The farm's view (``recorder.View``). ``emit``: each line goes there instead
    (``mpswrap.farm()``'s log), and ``bar`` and ``auto`` mean ``lines``."""

    def __init__(
        self,
        mode: str = "auto",
        stream: TextIO | None = None,
        emit: Callable[[str], None] | None = None,
        heartbeat: float = HEARTBEAT,
    ) -> None:
        self.stream = stream or sys.stderr
        self.emit, self.heartbeat = emit, heartbeat
        tty = getattr(self.stream, "isatty", lambda: False)()
        self.mode = ("bar" if tty else "lines") if mode == "auto" else mode
        if emit is not None and self.mode == "bar":
            self.mode = "lines"
        self.drawn = self.said = time.monotonic()
        self.width = 0
        if self.mode == "bar":  # mpswrap's own log lines go above the bar, not across it
            for handler in logging.getLogger("mpswrap").handlers:
                handler.addFilter(self._clear)

    def _clear(self, record: logging.LogRecord) -> bool:
        self._erase()
        return True

    def report(self, records: Sequence[TaskRecord], tally: Tally) -> None:
        if self.mode == "off":
            return
        now = time.time()
        for record in records:
            if self._shows(record) and self.mode == "quiet":
                self._line(attempt_line(record))
            elif self._shows(record):
                self._line(f"{attempt_line(record)} [{state_words(tally, now)}]")
        beat = self.heartbeat > 0 and time.monotonic() - self.said >= self.heartbeat
        if self.mode == "lines" and beat:
            self._line(state_words(tally, now))
        if self.mode == "bar" and time.monotonic() - self.drawn >= REDRAW:
            self._bar(f"mpswrap: farm: {state_words(tally, now)}")

    def _shows(self, record: TaskRecord) -> bool:
        """Every attempt (lines); a failure (bar); a failure for good (quiet)."""
        if self.mode == "quiet":
            return not record.retried and record.status not in (DONE, INTERRUPTED)
        return self.mode == "lines" or record.status not in (DONE, INTERRUPTED)

    def note(self, lane: Lane, before: Change, change: Change) -> None:
        """A line of its own (a GPU's K changed), whatever the mode but ``off`` and quiet."""
        if self.mode not in ("off", "quiet"):
            self._line(k_line(lane.position, before, change))

    def close(self) -> None:
        """The bar's line ended, so that what follows starts a line of its own."""
        if self.mode == "bar" and self.width:
            self._write("\n")
            self.width = 0
        for handler in logging.getLogger("mpswrap").handlers:
            handler.removeFilter(self._clear)

    def _erase(self) -> None:
        if self.width:
            self._write("\r" + " " * self.width + "\r")
            self.width = 0

    def _bar(self, text: str) -> None:
        self._write("\r" + text.ljust(self.width))
        self.width, self.drawn = len(text), time.monotonic()

    def _line(self, text: str) -> None:
        self.said = time.monotonic()
        if self.emit is not None:
            self.emit(f"farm: {text}")
            return
        if self.mode == "bar":
            self._erase()
        self._write(f"mpswrap: farm: {text}\n")

    def _write(self, text: str) -> None:
        """A display: its stream closed (a pipe's reader gone) must not end the farm."""
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.mode = "off"


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
    words = f"{tally.total + tally.done_before} tasks: {tally.done} done, {tally.failed} failed"
    if tally.interrupted:
        words += f", {tally.interrupted} interrupted"
    if running or tally.now_running:
        words += f", {tally.now_running} running"
    return words + f", {tally.not_run - tally.interrupted} not run, {tally.done_before} done before"


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
    lines += [f"  not run: task {t.number}: {t.command}" for t in not_run[:SHOWN_FAILURES]]
    return lines


def failure_words(record: TaskRecord) -> str:
    """``task 7 (exit 3, failed): CMD  log: PATH``."""
    return (
        f"task {record.task} ({exit_words(record.code)}, {record.status}): "
        f"{shown(record.command, 300)}  log: {shown(record.stderr, 300)}"
    )


def _counter() -> Counter[str]:
    return Counter()
