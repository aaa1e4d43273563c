"""K, the tasks a farm runs at once on one GPU: given (``--per-gpu K``), or found as the farm
runs (``--per-gpu auto``). Pure logic: the farm's engine tells it what happened and when.

The rule (auto). Start at today's default K (``start_k``: the cap, at most ``START_MAX``; the
cap: the GPU's free MPS clients, the job's CPUs per GPU). Once the GPU runs exactly K tasks,
count the tasks that finish from then on; after a window of ``max(WINDOW_MIN, K)`` finishes,
about one generation of tasks (two after a lower), its throughput is finishes per second since
the GPU ran K. Then:

- the first window, or more than ``MARGIN`` above the best K measured so far: **raise**, K
  doubled (at most the cap);
- otherwise (or at the cap): **lower**, half the fewest K measured, as long as that fewest
  K's window holds within ``MARGIN`` of the best (as much work for fewer CPUs and less
  memory), and at least ``EXPLORE`` generations of tasks still wait to pay for the try;
- else K settles at the fewest tasks measured within ``MARGIN`` of the best throughput
  (**hold**, or **back-off** where the last window fell short), and the search ends.

Why it starts high and searches down. A raise waits for a generation of tasks, and tasks
whose start-up takes seconds (a PyTorch import: about 10 s on an H100) spend it below the K
they reach. On the H100 (2026-11-25, docs/gpu-results), 18 light and 4 long tasks from K=2
reached 0.47 of fixed K=16's throughput, and 24 light tasks from half the cap 0.86. Too many
tasks cost little where MPS shares the GPU (16 small trainings at once did 1.05 tasks/s, 8
did 0.59); too few cost in proportion. So auto begins where today's default does, the first
task's memory and the GPU's free memory bound it from the start (``gpumemory``), and only a
farm with work left to pay for it tries fewer.

An out-of-memory failure lowers K to one less than the tasks that ran there (``oom``), and K
is never raised above that again; so does a GPU whose free memory cannot take another task
(``memory``: K becomes the tasks it runs). A given K never changes.

``MARGIN`` is 10 %: a window's throughput is a count of finishes over a time span measured at
the engine's wake (0.25 s), and with tasks of lengths varying several-fold two windows of the
same K differ by several per cent; 10 % is above that spread, and a raise that gains less
than 10 % is not worth its CPUs and memory. It is chosen, not measured on a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .._struct import Struct, field

__all__ = ["EXPLORE", "MARGIN", "START_MAX", "WHYS", "Change", "Packing", "converge", "start_k"]

#: A window's throughput must beat the best K's by this fraction to raise K again, and fall
#: below it by this fraction to back off.
MARGIN = 0.10
#: Auto starts at the cap, at most this: today's default K (``farm.default_per_gpu``).
START_MAX = 16
#: Fewer tasks are tried only while this many generations (K tasks each) still wait: the
#: lower K's window costs up to a generation of throughput where it turns out short.
EXPLORE = 4
#: The fewest finishes a window counts.
WINDOW_MIN = 4


#: The reasons a change of K gives (a journal's others are shown as ``?``).
WHYS = ("start", "raise", "lower", "hold", "back-off", "oom", "memory", "profile")


class Change(Struct, frozen=True):
    """K set at ``t`` (epoch seconds): its value, the throughput that decided it (tasks per
    second over the window; None where none was measured), and why."""

    t: float
    k: int
    throughput: float | None
    why: str  # one of WHYS

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "k": self.k, "throughput": self.throughput, "why": self.why}


class Packing(Struct):
    """K of one GPU, and how it came to be."""

    cap: int
    auto: bool
    k: int
    history: list[Change] = field(default_factory=list)
    #: Throughput measured at each K.
    rates: dict[int, float] = field(default_factory=dict)
    #: K is never raised above it (the cap; lowered by oom and memory).
    ceiling: int = 0
    #: The search is over (hold, back-off): K changes only for oom or memory.
    settled: bool = False
    #: A raise gained nothing: K goes down from the fewest measured while throughput holds.
    lowering: bool = False
    #: When the GPU first ran K tasks, and the finishes since: the current window.
    since: float | None = None
    finishes: int = 0
    #: K is never lowered for throughput below it: what the CPUs allow for CPU-light tasks
    #: (``sizing.cpu_floor``); out of memory still lowers it.
    floor: int = 1

    @classmethod
    def start(cls, now: float, cap: int, given: int | None = None) -> Packing:
        """A given K, or auto's start."""
        cap = max(1, cap)
        k = given if given is not None else start_k(cap)
        packing = cls(cap, given is None, k, ceiling=cap)
        packing.history.append(Change(now, k, None, "start"))
        return packing

    @property
    def window(self) -> int:
        """A generation of tasks; two after a lower, whose window opens on the longest of the
        tasks that ran before it (the short ones finished first)."""
        return max(WINDOW_MIN, (2 if self.lowering else 1) * self.k)

    @property
    def last(self) -> Change:
        return self.history[-1]

    def running(self, now: float, count: int) -> None:
        """The GPU runs ``count`` tasks now: the window opens when they are K (after a raise,
        when they reach it; after a lower, when those above it have finished)."""
        if self.since is None and count == self.k:
            self.since, self.finishes = now, 0

    def finished(self, now: float, waiting: float = math.inf) -> Change | None:
        """A task of this GPU finished (done or failed), ``waiting`` tasks wait for it: a
        change of K, if any."""
        if not self.auto or self.settled or self.since is None:
            return None
        self.finishes += 1
        if self.finishes < self.window or now <= self.since:
            return None
        return self.judge(now, self.finishes / (now - self.since), waiting)

    def judge(self, now: float, rate: float, waiting: float = math.inf) -> Change:
        """The rule, once K's window measured ``rate`` tasks per second, with ``waiting``
        tasks left to run here."""
        best = max(self.rates.values(), default=None)
        self.rates[self.k] = max(rate, self.rates.get(self.k, 0.0))
        top = max(self.rates.values())
        rising = not self.lowering and (best is None or rate > best * (1 + MARGIN))
        if rising and self.k < self.ceiling:
            return self._set(now, min(self.ceiling, 2 * self.k), rate, "raise")
        floor = top * (1 - MARGIN)
        fewest = min(self.rates)
        least = min(self.ceiling, max(1, self.floor))  # the fewest K may go to
        first = len(self.rates) == 1  # at the cap from the start: nothing above to try
        lower = (first or not rising) and fewest > least and self.rates[fewest] >= floor
        if lower and waiting >= EXPLORE * self.k:
            self.lowering = True
            return self._set(now, max(least, fewest // 2), rate, "lower")
        self.settled = True
        keep = max(least, min(k for k, r in self.rates.items() if r >= floor))
        return self._set(now, keep, rate, "hold" if rate >= floor else "back-off")

    def oom(self, now: float, running: int) -> Change | None:
        """A task of this GPU ran out of memory while ``running`` tasks ran there (itself
        too): K one less, and never more again. None for a given K."""
        if not self.auto:
            return None
        k = max(1, min(self.k, running) - 1)
        self.ceiling = min(self.ceiling, k)
        return self._set(now, k, None, "oom")

    def memory(self, now: float, running: int) -> Change | None:
        """The GPU's free memory cannot take another task beside the ``running`` ones: K
        becomes that many (a change only when it lowers K)."""
        if not self.auto or running < 1 or running >= self.k:
            return None
        self.ceiling = min(self.ceiling, running)
        return self._set(now, running, None, "memory")

    def _set(self, now: float, k: int, rate: float | None, why: str) -> Change:
        self.k = k
        self.since, self.finishes = None, 0
        change = Change(now, k, rate, why)
        self.history.append(change)
        return change


def start_k(cap: int) -> int:
    """Where auto starts: the cap, at most ``START_MAX``."""
    return max(1, min(cap, START_MAX))


def converge(rates: Mapping[int, float], cap: int) -> Packing:
    """Where auto settles in a long farm when the throughput at each K is ``rates``'
    (``calibrate``'s measurements): the same rule, walked over them. It stops at a K not
    measured."""
    packing = Packing.start(0.0, cap)
    while not packing.settled and packing.k in rates:
        before = packing.k
        packing.judge(0.0, rates[packing.k])
        if packing.k == before:
            break
    return packing
