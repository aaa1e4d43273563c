"""What ``mpswrap farm`` shows while it runs, all of it from the fold of its journal
(``fold.Tally``): the progress line (the summary at the end: ``words``).

On a terminal (``--progress auto``, stderr a tty) one line is redrawn at most twice a second:
``farm: 12/40 finished (11 done, 1 failed), 6 running, 2 retried, ETA 1m20s``; a failure is
printed above it, and the line is ended before anything else is printed after it. Elsewhere
(a batch job's output file) one plain line per finished attempt, and every ``--heartbeat``
seconds (60 by default) without one a line of where the farm stands, so that a log shows the
farm alive. ``quiet`` (``-q``) shows the failures only.

The ETA: the mean of the attempts finished so far is what a task takes (before any finished,
the longest a running task has run: a task takes at least that); a running task has the mean
less its age left, or, once it outlived the mean, as long again as it ran; the work left is
spread over the farm's places (K on each GPU); with none waiting, or once the farm starts no
more (a ``--halt``, a signal: the journal's ``halt``), the running task with most left, and
no ETA with none running.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from .fold import Tally
from .journal import DONE, INTERRUPTED, TaskRecord
from .lanes import Lane
from .packing import Change
from .recorder import View
from .words import attempt_line, k_line

__all__ = ["ETA_RULE", "HEARTBEAT", "Progress", "duration", "eta", "state_words"]

#: Seconds between two redraws of the progress line.
REDRAW = 0.5
#: Seconds without a line, when the output is no terminal, before one says where it stands.
HEARTBEAT = 60.0
#: What the ETA's estimate is, for ``farm status --json``.
ETA_RULE = (
    "mean time of the finished attempts (before any: the longest running one's age); each "
    "task not started takes the mean, each running one the mean less its age (once past the "
    "mean: its age again); spread over K x GPUs places; once the farm halted, the running "
    "ones only"
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
    if tally.not_run <= 0 or tally.halted:  # halted: the tasks not run stay so
        return max(ahead, default=None)
    return (tally.not_run * mean + sum(ahead)) / max(1, tally.slots)


def _left(mean: float, age: float) -> float:
    """What a running attempt has left: the mean's rest, or as long again past it; at least
    a second (an ETA is never 0 while a task runs)."""
    return max(mean - age if age < mean else age, 1.0)


def state_words(tally: Tally, now: float) -> str:
    """``3/10 finished (2 done, 1 failed), 4 running, ETA 12s``: the progress line's, and
    ``farm status``'s."""
    text = f"{tally.finished}/{tally.total} finished ({tally.done} done, {tally.failed} failed"
    text += f", {tally.interrupted} interrupted)" if tally.interrupted else ")"
    text += f", {tally.now_running} running"
    if tally.settling:
        text += f", {len(tally.settling)} ending"
    if tally.retried:
        text += f", {tally.retried} retried"
    left = eta(tally, now)
    if tally.halted:
        text += f", halted ({tally.halted}): no more tasks start"
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
        shown = [r for r in records if self._shows(r)]
        for record in shown:
            # The tally is the farm's after all of these: only the last line may say it.
            last = record is shown[-1] and self.mode != "quiet"
            state = f" [{state_words(tally, now)}]" if last else ""
            self._line(f"{attempt_line(record)}{state}")
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
            self._line(k_line(lane.number, before, change))

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
