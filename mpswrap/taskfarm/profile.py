"""What a user's farms learned of their commands, so that a farm of known tasks starts at the
right K: a small per-user profile (``paths.farm_profile``), keyed by a command's normalized text.

The normalized text is the command with each run of digits as ``#`` and its blanks collapsed:
``train.py --seed 3`` and ``train.py --seed 41`` are one command. For each, the profile keeps
the most GPU memory a task held (its steady peak), the median seconds a task took, the K its
GPU settled at under auto, and when it was last seen; at most ``ENTRIES`` commands, the oldest
dropped. At a farm's start, where most of its tasks are known, each GPU starts at their K
(``Change`` why ``profile``) and admits by their known peak from the first task; at its end the
farm writes what it learned. The file is the user's own, read as any file someone wrote: at
most ``LIMIT`` bytes, typed, and anything else in it ignored; a profile that cannot be written
costs nothing but the next farm's start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import statistics
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import fields
from .._struct import Struct
from ..paths import read_job_file
from .fold import Tally
from .lanes import Lane
from .packing import Change
from .tasks import Task

__all__ = ["Known", "Profile", "command_key"]

log = logging.getLogger(__name__)

#: Commands a profile keeps, and its size.
ENTRIES, LIMIT = 256, 1 << 20
_DIGITS = re.compile(r"[0-9]+")


def command_key(command: str) -> str:
    """The normalized text's hash: digits as ``#``, blanks collapsed."""
    text = " ".join(_DIGITS.sub("#", command).split())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Known(Struct, frozen=True):
    """What the profile knows of one command."""

    peak: int  # bytes, 0: none seen
    seconds: float
    k: int  # 0: no K settled
    seen: float

    @classmethod
    def of(cls, data: Any) -> Known | None:
        if not isinstance(data, dict):
            return None
        peak, seconds, k, seen = (data.get(n) for n in ("peak", "seconds", "k", "seen"))
        numbers = [peak, seconds, k, seen]
        if any(isinstance(v, bool) or not isinstance(v, int | float) for v in numbers):
            return None
        if not all(0 <= v < 1e15 for v in numbers):  # type: ignore[operator]
            return None
        return cls(int(peak), float(seconds), int(k), float(seen))  # type: ignore[arg-type]

    def start(self, lane: Lane, now: float) -> None:
        """A GPU of a farm of known tasks: their peak goes by from the first task, their K is
        where K starts (within the cap; the journal says why: ``profile``)."""
        packing = lane.packing
        if packing is None:
            return
        if self.peak > 0:
            lane.peaks.seen.append(self.peak)
        if 0 < self.k != packing.k:
            packing.k = min(packing.ceiling, self.k)
            packing.history.append(Change(now, packing.k, None, "profile"))


class Profile:
    """A user's profile, read once; ``learn`` and ``save`` at a farm's end."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.known: dict[str, Known] = {}
        text = read_job_file(path, LIMIT) if path is not None else None
        try:
            data = fields.json_value(text) if text else {}
        except ValueError:
            data = {}
        for key, value in data.items() if isinstance(data, dict) else []:
            known = Known.of(value)
            if known is not None and isinstance(key, str) and len(key) == 16:
                self.known[key] = known

    def of(self, commands: Iterable[str]) -> Known | None:
        """What is known of most of ``commands`` (more than half of them one command), else
        None: the largest peak, the longest median and the K of those known."""
        keys = [command_key(c) for c in commands]
        found = [self.known[k] for k in keys if k in self.known]
        if not keys or 2 * len(found) <= len(keys):
            return None
        ks = [f.k for f in found if f.k]
        return Known(
            max(f.peak for f in found),
            max(f.seconds for f in found),
            min(ks) if ks else 0,
            max(f.seen for f in found),
        )

    def learn(self, command: str, peaks: list[int], seconds: list[float], k: int) -> None:
        if not seconds:
            return
        key = command_key(command)
        old = self.known.get(key)
        self.known[key] = Known(
            max([*peaks, 0]) or (old.peak if old else 0),
            statistics.median(seconds),
            k or (old.k if old else 0),
            time.time(),
        )

    def learn_farm(self, lanes: Sequence[Lane], tasks: Sequence[Task], tally: Tally) -> None:
        """What an auto farm taught of its commands (their peaks on each GPU, the seconds of
        its done attempts, the K its GPUs settled at), saved."""
        if all(ln.packing is None or not ln.packing.auto for ln in lanes):
            return
        ks = [ln.packing.k for ln in lanes if ln.packing and ln.packing.settled]
        peaks = [p for ln in lanes for p in ln.peaks.seen]
        took = [s for row in tally.gpus.values() for s in row.done_s]
        for command in list(dict.fromkeys(t.command for t in tasks))[:ENTRIES]:
            self.learn(command, peaks, took, min(ks) if ks else 0)
        self.save()

    def save(self) -> None:
        """Written whole (a temporary file renamed over it); a failure is logged, no more."""
        if self.path is None:
            return
        newest = sorted(self.known.items(), key=lambda kv: kv[1].seen)[-ENTRIES:]
        text = json.dumps({k: _json(v) for k, v in newest}, sort_keys=True)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".farm-profile.")
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.debug("farm profile not saved (%s)", exc)


def _json(known: Known) -> Mapping[str, float]:
    return {"peak": known.peak, "seconds": known.seconds, "k": known.k, "seen": known.seen}
