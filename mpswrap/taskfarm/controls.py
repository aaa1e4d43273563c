"""The farm's controls, as GNU parallel's users know them: when to stop (``--halt``), how long
a task may run (``--timeout``), how often a failed task runs again (``--retries``). Pure logic:
the engine asks, the journal records what came of it.

``--halt never`` (the default) runs every task. ``--halt soon,fail=N`` starts no new task once
N tasks failed for good and lets the running ones finish; ``now,fail=N`` also ends those
(through terminate_client, recorded as interrupted: a farm run again runs them). ``fail=P%``:
once P % of the share's tasks failed (as ``parallel --halt soon,fail=10%`` counts, of all the
jobs). A task failed for good is one no retry is left for: its exit code, a timeout, a fault or
an out-of-memory on its last try. ``success=N`` counts the tasks done instead, ``done=N`` both;
parallel's older numbers are read too (1: ``soon,fail=1``, 2: ``now,fail=1``, -1:
``soon,success=1``, -2: ``now,success=1``). Tasks a halt on success (or done) left unrun do not
make the exit code 1: the farm stopped as asked.

``--retries N``: a task that fails (exit code, timeout) runs up to N more times (GNU parallel's
``--retries N`` means N runs in all). GPU faults and
out-of-memory keep their own retries, whatever N: a fault's victim runs again up to
``max(FAULT_RETRIES, N)`` more times (it did nothing wrong), an out-of-memory one up to
``journal.OOM_TRIES`` runs in all, on a GPU whose K was lowered.
"""

from __future__ import annotations

import math
import re

from .._struct import Struct
from ..errors import UsageError
from .journal import FAULT, INTERRUPTED, OOM

__all__ = [
    "FAULT_RETRIES",
    "NEVER",
    "OOM_TRIES",
    "Halt",
    "after_failure",
    "parse_halt",
    "retry_left",
]

#: More runs of a task a fatal GPU fault ended, at least (``--retries`` may give more).
FAULT_RETRIES = 1
#: Runs of a task that keeps running out of memory, the first one included.
OOM_TRIES = 3
_HALT = re.compile(r"(now|soon),(fail|success|done)=([0-9]{1,9})(%?)")
#: GNU parallel's older ``--halt`` numbers.
_NUMBERS = {"1": "soon,fail=1", "2": "now,fail=1", "-1": "soon,success=1", "-2": "now,success=1"}


class Halt(Struct, frozen=True):
    """``--halt``: ``when`` (never, soon, now) and the tasks that trigger it (a count, or a
    percentage of the tasks) of ``what`` ended so: failed for good (``fail``), done
    (``success``), either (``done``)."""

    when: str = "never"
    count: int = 0
    percent: bool = False
    what: str = "fail"

    def reached(self, failed: int, total: int, done: int = 0) -> bool:
        """Whether ``failed`` tasks failed for good and ``done`` were done (of ``total``)
        trigger it."""
        counted = {"fail": failed, "success": done, "done": failed + done}[self.what]
        if self.when == "never" or counted < 1:
            return False
        need = math.ceil(total * self.count / 100) if self.percent else self.count
        return counted >= max(1, need)

    def __str__(self) -> str:
        if self.when == "never":
            return self.when
        return f"{self.when},{self.what}={self.count}" + ("%" if self.percent else "")


NEVER = Halt()


def parse_halt(text: str) -> Halt:
    """``never``, ``WHEN,WHAT=N`` or ``WHEN,WHAT=P%`` (WHEN now or soon, WHAT fail, success
    or done), or one of parallel's older numbers."""
    text = text.strip()
    if text in ("never", "0"):
        return NEVER
    match = _HALT.fullmatch(_NUMBERS.get(text, text))
    percent = bool(match and match[4])
    if not match or int(match[3]) < 1 or (percent and int(match[3]) > 100):
        raise UsageError(
            "bad --halt",
            thing=text,
            cause="expected never, or now or soon with fail=N, success=N or done=N (N >= 1) "
            "or with a percentage of the tasks, e.g. soon,fail=10%",
        )
    return Halt(match[1], int(match[3]), percent, match[2])


def retry_left(status: str, attempt: int, ooms: int, retries: int) -> bool:
    """Whether a task whose attempt ``attempt`` ended ``status`` (after ``ooms`` runs out of
    memory, this one included) runs again."""
    if status == FAULT:
        return attempt <= max(FAULT_RETRIES, retries)
    if status == OOM:
        return ooms < OOM_TRIES
    return attempt <= retries


def after_failure(status: str, left: bool, stopping: bool, halting: bool) -> tuple[str, bool]:
    """What a failed attempt is recorded as, and whether its task runs again (``left``: a
    retry is left, ``retry_left``). A farm a signal (or ``--halt now``) is stopping would
    have run it again: it is interrupted, not failed, and a farm run again runs it; a halt
    that lets running tasks finish keeps it failed, as parallel's ``--halt soon`` does."""
    if stopping and left:
        return INTERRUPTED, False
    return status, left and not halting
