"""What a farm learns of its tasks' GPU memory, and the two things it decides with it: whether
a GPU may take another task (admission), and whether a failed task only ran out of memory
(``oom``: not its fault). Pure logic over NVML's readings (``mps.gpu.usage``), taken at the
engine's wake.

A task's peak is the most GPU memory its processes held at one reading (NVML per process, as
``mpswrap status`` reads it). The peak the farm expects of the next task is a high quantile
(``PEAK_QUANTILE``) of the peaks seen, finished tasks and running ones alike (a running task's
once two readings in a row showed it no larger: not between its CUDA context and its first
allocation). A GPU takes another task only if its free memory, less what its running tasks may
still grow into (the expected peak less what each holds now), covers the expected peak plus a
margin (``margin``). A GPU that runs none of the farm's tasks always takes one: nothing else
would ever free its memory. Before any peak is known tasks run alone, until NVML shows one's
memory steady, ``LEARN_TASKS`` finished with no memory seen (a short task can end between two
readings of a busy farm: one such task proves nothing), or ``LEARN_S`` passed since the GPU's
first task started (NVML may not report per-process memory at all).

A failed task ran out of memory when its output carries CUDA's or PyTorch's out-of-memory
text (``OOM_TEXT``) and NVML showed its GPU (nearly) full while it ran or as it ended (the
engine reads a GPU as it sees tasks there fail, the others' memory still held,
``lanes.read_failed``): less free than what the others were seen to need, steady or not,
plus the margin, or less than ``FULL_FRACTION`` of the GPU. A task alone on an empty GPU that
asks for more than the GPU has is no victim: it fails as before.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .._struct import Struct

__all__ = [
    "FULL_FRACTION",
    "LEARN_S",
    "LEARN_TASKS",
    "OOM_TEXT",
    "PEAK_QUANTILE",
    "Peaks",
    "Reading",
    "admits",
    "margin",
    "out_of_memory",
]

#: The quantile of the peaks seen that the next task is expected to need.
PEAK_QUANTILE = 0.9
#: Headroom beyond the expected peak: a fraction of the GPU, at least ``MARGIN_MIN`` bytes
#: (allocators round up; a CUDA context alone is a few hundred MiB).
MARGIN_FRACTION = 0.02
MARGIN_MIN = 256 << 20
#: Peaks kept of the finished tasks of a GPU (the most recent), for the quantile.
PEAKS_KEPT = 512
#: Seconds after a GPU's first task started that its tasks run alone at most while no memory
#: is known, and the tasks that finish there with no memory seen before they stop doing so.
LEARN_S = 30.0
LEARN_TASKS = 2
#: Less free than this fraction of the GPU is "full" for the out-of-memory verdict.
FULL_FRACTION = 0.10
#: CUDA runtime ("CUDA error 2: out of memory", cudaGetErrorString), PyTorch
#: ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ..."), the driver API and
#: cuBLAS names of the same error.
OOM_TEXT = re.compile(
    r"CUDA out of memory|CUDA error[^\n]{0,40}out of memory|OutOfMemoryError"
    r"|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|CUBLAS_STATUS_ALLOC_FAILED"
)


class Reading(Struct, frozen=True):
    """One NVML reading of a GPU: bytes used and total, and each process's bytes."""

    used: int
    total: int
    processes: Mapping[int, int]

    @property
    def free(self) -> int:
        return max(0, self.total - self.used)

    @classmethod
    def of(cls, usage: Mapping[str, Any] | None) -> Reading | None:
        """From ``mps.gpu.usage``; None where NVML gave no memory figures."""
        if not usage:
            return None
        used, total = usage.get("memory_used_bytes"), usage.get("memory_total_bytes")
        if not isinstance(used, int) or not isinstance(total, int) or total <= 0:
            return None
        return cls(used, total, dict(usage.get("processes") or {}))


def margin(total: int) -> int:
    return max(MARGIN_MIN, int(total * MARGIN_FRACTION))


class Peaks(Struct):
    """The peaks of the finished tasks of one GPU (bytes)."""

    seen: list[int]
    #: Tasks finished here, with or without a peak.
    finished: int = 0

    def add(self, peak: int) -> None:
        self.finished += 1
        if peak > 0:
            self.seen.append(peak)
            del self.seen[:-PEAKS_KEPT]  # the recent ones: a long farm's memory stays flat

    def learning(self, expected: int | None, first_started: float, now: float) -> bool:
        """Still learning: no peak known, fewer than ``LEARN_TASKS`` finished (none with a peak),
        the GPU's first task started lately."""
        return expected is None and self.finished < LEARN_TASKS and now - first_started < LEARN_S

    def expected(self, running: Iterable[int] = ()) -> int | None:
        """The ``PEAK_QUANTILE`` of the peaks seen and those of the running tasks (nearest
        rank); None before any task held memory."""
        values = sorted(p for p in [*self.seen, *running] if p > 0)
        if not values:
            return None
        return values[max(0, math.ceil(PEAK_QUANTILE * len(values)) - 1)]


def admits(reading: Reading | None, expected: int | None, held: Iterable[int]) -> bool:
    """May the GPU take another task beside running ones that hold ``held`` bytes each?
    Yes where nothing is known yet (no reading, no peak)."""
    if reading is None or expected is None:
        return True
    growth = sum(max(0, expected - h) for h in held)
    return reading.free - growth >= expected + margin(reading.total)


def out_of_memory(text: str, least_free: int | None, total: int, expected: int | None) -> bool:
    """Did the task fail for want of memory: its output says so, and NVML showed the GPU
    (nearly) full while it ran or as it ended (``least_free``: the least free read then)?"""
    if least_free is None or total <= 0 or not OOM_TEXT.search(text):
        return False
    full = max(total * FULL_FRACTION, (expected or 0) + margin(total))
    return least_free < full
