"""The farm's GPUs (lanes) and the attempts they run: whether a GPU takes another task now (its
K, its free memory, a fault of its server), and what the farm learns there.

K is the lane's ``Packing`` (given, or found as the farm runs: ``packing``). Under auto, the
GPU's memory is read through NVML at most every ``READ_EVERY`` seconds while tasks run there
(``usage``), and once more as soon as tasks there fail (``read_failed``: for the out-of-memory
verdict only): a GPU takes another task only while its free memory covers the peak its tasks
are expected to need (``admission``). Before any peak is known, tasks run alone until a reading
shows one's memory steady (two readings without growth: then admission goes by it),
``admission.LEARN_TASKS`` finished with no memory seen, or ``admission.LEARN_S`` passed since
the GPU's first task started. A GPU whose server faulted takes no new task until server.log
says it recovered, or the tasks the fault named have exited (``HOLD_MAX`` at most), and
``RECOVER_WAIT`` more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import _proc
from .._struct import Struct, field
from ..job.placement import Slot
from ..job.supervise import Rank
from ..mps.daemon import Daemon
from .admission import Peaks, Reading, admits
from .faultwatch import FaultWatch
from .packing import Change, Packing
from .tasks import Task

__all__ = [
    "Attempt",
    "Lane",
    "Usage",
    "admits_now",
    "read_failed",
    "read_memory",
    "watch_faults",
]

log = logging.getLogger(__name__)

#: Seconds a GPU waits, once the clients of a fault have exited, before it takes tasks again.
RECOVER_WAIT = 0.5
#: Seconds a GPU waits at most for its server to recover from a fault (a client that never
#: exits keeps it in FAULT): then it takes tasks again, which a server still in FAULT refuses.
HOLD_MAX = 60.0
#: Seconds between two readings of a GPU's memory at most: a short task that fails for want of
#: memory must be seen on its full GPU while it lives.
READ_EVERY = 0.05
#: NVML's figures of a GPU (``mps.gpu.usage`` of its UUID); None: NVML not asked.
Usage = Callable[[str], "Mapping[str, Any] | None"]


class Lane(Struct):
    """One GPU of the farm: its free seats, its K, its memory and whether it takes clients."""

    position: int
    slot: Slot
    daemon: Daemon | None  # None: no MPS (calibrate's time-sliced runs)
    seats: list[int]
    watch: FaultWatch | None = None
    #: Since when a fault keeps this GPU from taking tasks; None: it takes them.
    paused_at: float | None = None
    #: Attempts (by id) the fault hit: once all have exited the server takes clients again.
    holding: set[int] = field(default_factory=set)
    resume_at: float = 0.0
    #: A task failed here since server.log was last read.
    suspect: bool = False
    #: K: given, or found as the farm runs (None: as many as the seats).
    packing: Packing | None = None
    #: NVML's last reading of the GPU's memory (None: none taken), when, and the tasks' peaks.
    reading: Reading | None = None
    read_at: float = 0.0
    peaks: Peaks = field(default_factory=lambda: Peaks([]))
    #: When the GPU's first task of this farm started (None: none yet): learning's clock.
    first_start: float | None = None
    running: int = 0
    #: When its daemon's clients were last listed (attachment).
    listed_at: float = 0.0

    @property
    def k(self) -> int:
        return self.packing.k if self.packing else self.running + len(self.seats)

    @property
    def number(self) -> int:
        """The GPU's number in messages and the journal: its index on the node."""
        return self.slot.number(self.position)

    def takes(self, now: float) -> bool:
        return (
            bool(self.seats)
            and self.running < self.k
            and self.paused_at is None
            and now >= self.resume_at
        )

    def repack(self, change: Change | None) -> Change | None:
        """A change of K, passed on (None where K is given or did not change)."""
        return change if self.packing is not None else None


class Attempt(Struct):
    """One run of a task, on a lane."""

    task: Task
    number: int
    lane: Lane
    seat: int
    rank: Rank
    start: float
    pidfd: int | None = None
    end: float = 0.0
    code: int = 0
    #: The signal that ended it (0: it exited), and the CPU seconds it used.
    signal: int = 0
    cpu: float = 0.0
    #: Why the farm ended it, if it did: "stop" (a signal, --halt now), "timeout".
    ended_by: str = ""
    #: When its ladder's SIGKILL is due (a timeout), if it runs until then.
    kill_at: float | None = None
    #: Seen among its server's clients (True), past the check's timeout unseen (False).
    attached: bool | None = None
    #: The most GPU memory its processes held at one reading; the least free memory of its
    #: GPU read while it ran (None: none read).
    peak: int = 0
    least_free: int | None = None
    #: What it held at the last reading, and its peak once a reading showed no growth: a
    #: task seen between its CUDA context and its first allocation is not yet a peak to go by.
    held: int = 0
    steady: int = 0
    #: Failed: what the GPU's other tasks were seen to need as it ended (``read_failed``).
    others_need: int | None = None


def read_memory(lane: Lane, mine: Sequence[Attempt], usage: Usage, now: float) -> None:
    """NVML's reading of the lane's GPU (at most every ``READ_EVERY`` s; also idle: the first
    task's start is judged on one); each running task's peak, and the least free memory its
    GPU had while it ran."""
    if now - lane.read_at < READ_EVERY:
        return
    lane.read_at = now
    lane.reading = reading = Reading.of(usage(lane.slot.uuid))
    if reading is None:
        return
    held = _held_by(mine, reading)
    for attempt in mine:
        now_held = held.get(id(attempt), 0)
        attempt.peak = max(attempt.peak, now_held)
        if now_held and now_held <= attempt.held:
            attempt.steady = attempt.peak
        attempt.held = now_held
        least = attempt.least_free
        attempt.least_free = reading.free if least is None else min(least, reading.free)


def expected(lane: Lane, mine: Sequence[Attempt]) -> int | None:
    """The peak the next task of the lane is expected to need (None: none known yet)."""
    return lane.peaks.expected(a.steady for a in mine)


def read_failed(
    lane: Lane, failed: Sequence[Attempt], mine: Sequence[Attempt], usage: Usage
) -> None:
    """The GPU as tasks of it failed, read at once (however recent the last reading), the
    running tasks' memory still held: for the out-of-memory verdict of each failed one, the
    least free memory (what a failed task may still hold counted as free) and what the others
    were seen to need (``Attempt.others_need``: as ``expected``, each running task's most
    held, steady or still growing; never the failed task's own, so that a task alone that asks
    for more than the GPU has is no victim). The lane's reading and the running tasks'
    peaks, steadiness and least free memory are left as the regular readings make them."""
    reading = Reading.of(usage(lane.slot.uuid))
    if reading is None:
        return
    held = _held_by([*mine, *failed], reading)
    seen = [max(a.peak, held.get(id(a), 0)) for a in mine]
    for attempt in failed:
        free = reading.free + held.get(id(attempt), 0)
        least = attempt.least_free
        attempt.least_free = free if least is None else min(least, free)
        attempt.others_need = lane.peaks.expected(seen)


def admits_now(lane: Lane, mine: Sequence[Attempt]) -> tuple[bool, Change | None]:
    """Whether the GPU's free memory takes another task (always, with none running, where K
    is given, or where NVML gives no figures), and a change of K where it does not."""
    packing, reading = lane.packing, lane.reading
    if packing is None or not packing.auto or not mine or reading is None:
        return True, None
    peak = expected(lane, mine)
    if peak is None:  # learning: until a task's memory is steady, LEARN_TASKS, or LEARN_S
        first = lane.first_start if lane.first_start is not None else min(a.start for a in mine)
        return not lane.peaks.learning(peak, first, lane.read_at), None
    if admits(reading, peak, [a.peak for a in mine]):
        return True, None
    return False, packing.memory(lane.read_at, lane.running)


def watch_faults(lane: Lane, mine: Sequence[Attempt], waiting: bool, now: float) -> None:
    """server.log is read where a task failed or a fault is being handled; a fault stops its
    GPU taking tasks until its server recovers."""
    if lane.watch is None or not (lane.suspect or waiting or lane.paused_at is not None):
        return
    lane.suspect = False
    new = lane.watch.refresh()
    if new:
        named = set().union(*(f.pids for f in new))
        hit = [a for a in mine if {p.pid for p in a.rank.tree()} & named]
        lane.holding = {id(a) for a in hit or mine}  # a shell's client is its child
        lane.paused_at = lane.paused_at or now
        log.warning(
            "farm: gpu %d: fatal GPU fault: its tasks are retried; no new task there until "
            "its server recovers",
            lane.number,
        )
    if lane.paused_at is not None and _recovered(lane, now):
        for fault in lane.watch.unrecovered():
            fault.recovered_at = now
        lane.paused_at, lane.holding = None, set()
        lane.resume_at = now + RECOVER_WAIT


def _recovered(lane: Lane, now: float) -> bool:
    assert lane.watch is not None
    assert lane.paused_at is not None
    if not lane.holding or all(f.logged_recovery for f in lane.watch.unrecovered()):
        return True
    if now - lane.paused_at < HOLD_MAX:
        return False
    log.warning(
        "farm: gpu %d: no recovery from the fault after %g s: taking tasks again",
        lane.number,
        HOLD_MAX,
    )
    return True


def _held_by(attempts: Sequence[Attempt], reading: Reading) -> dict[int, int]:
    """id(attempt) -> the GPU memory its processes hold (a shell's client is its child)."""
    roots = {a.rank.ident.pid: id(a) for a in attempts}
    out: dict[int, int] = {}
    for pid, size in reading.processes.items():
        owner = roots.get(pid)
        if owner is None:
            owner = next((roots[p] for p in _proc.lineage(pid) if p in roots), None)
        if owner is not None:
            out[owner] = out.get(owner, 0) + size
    return out
