"""K found as a farm runs (``taskfarm.packing``) and what the farm learns of GPU memory
(``taskfarm.admission``, a lane's admission and readings in ``taskfarm.lanes``, and the
reading the engine takes as a task fails): pure logic, no process."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from mpswrap.taskfarm.admission import (
    LEARN_S,
    LEARN_TASKS,
    Peaks,
    Reading,
    admits,
    margin,
    out_of_memory,
)
from mpswrap.taskfarm.engine import Farmer
from mpswrap.taskfarm.lanes import READ_EVERY, Attempt, Lane, admits_now, read_memory
from mpswrap.taskfarm.packing import EXPLORE, MARGIN, Packing, converge

GIB = 1 << 30


def _run(
    packing: Packing, rate_at: Callable[[int], float], finishes: int, queued: int | None = None
) -> Packing:
    """Feed ``finishes`` evenly spaced finishes at the throughput of the current K; the
    farm's tasks not yet started: ``queued`` less those started (a long farm by default)."""
    now = 0.0
    packing.running(now, packing.k)
    started = packing.k
    for _ in range(finishes):
        now += 1.0 / rate_at(packing.k)
        started += 1
        waiting = float("inf") if queued is None else max(0, queued - started)
        packing.finished(now, waiting)
        packing.running(now, packing.k)
    return packing


def test_auto_starts_at_todays_default_k() -> None:
    """The cap (free clients, a CPU per task), at most 16."""
    caps = (1, 2, 3, 4, 16, 48)
    assert [Packing.start(0.0, cap=c).k for c in caps] == [1, 2, 3, 4, 16, 16]


def test_rising_throughput_raises_k_to_the_cap() -> None:
    packing = _run(Packing.start(0.0, cap=64), float, 400)
    assert [(c.k, c.why) for c in packing.history] == [
        (16, "start"),
        (32, "raise"),
        (64, "raise"),
        (64, "hold"),  # 32 did half the work of 64: nothing fewer is tried
    ]
    assert packing.settled


def test_flat_throughput_lowers_k_to_the_knee() -> None:
    packing = _run(Packing.start(0.0, cap=16), lambda k: min(k, 4) * 1.0, 200)
    assert [(c.k, c.why) for c in packing.history] == [
        (16, "start"),
        (8, "lower"),  # at the cap, nothing above: fewer are tried
        (4, "lower"),
        (2, "lower"),  # 2 does half the work of 4: back to the fewest that held
        (4, "back-off"),
    ]
    assert packing.settled


def test_fewer_are_tried_only_while_enough_tasks_wait_to_pay_for_it() -> None:
    """A farm of 40 tasks at K=16: after the first window 8 wait, fewer than 4 generations."""
    packing = _run(Packing.start(0.0, cap=16), lambda k: min(k, 4) * 1.0, 40, queued=40)
    assert [(c.k, c.why) for c in packing.history] == [(16, "start"), (16, "hold")]
    queued = 16 + (EXPLORE + 1) * 16
    packing = _run(Packing.start(0.0, cap=16), lambda k: min(k, 4) * 1.0, 40, queued=queued)
    assert [(c.k, c.why) for c in packing.history][:2] == [(16, "start"), (8, "lower")]


def test_falling_throughput_backs_off_to_the_best_k() -> None:
    rates = {16: 1.0, 8: 2.5, 4: 4.0, 2: 2.0}
    packing = _run(Packing.start(0.0, cap=16), lambda k: rates[k], 200)
    assert [(c.k, c.why) for c in packing.history][-1] == (4, "back-off")
    assert packing.k == 4 and packing.settled


def test_an_improvement_within_the_margin_is_no_reason_to_raise() -> None:
    small = 1 + MARGIN / 2
    packing = _run(Packing.start(0.0, cap=64), lambda k: 2.0 * small ** (k > 16), 200)
    assert [(c.k, c.why) for c in packing.history][:3] == [
        (16, "start"),
        (32, "raise"),
        (8, "lower"),  # 32 gained less than the margin over 16: fewer are tried
    ]
    assert max(c.k for c in packing.history) == 32
    assert packing.k == 1 and packing.settled  # 1 to 32 all did the work within the margin


def test_heterogeneous_tasks_settle_where_the_work_is_done() -> None:
    """Tasks of 1 s and 6 s mixed at random; the GPU serves up to 8 at full speed, beyond
    that each task slows in proportion (16 and 32 do no more work than 8). Auto starts at
    16 of 32, gains nothing at 32 and tries fewer: 4 does less work. One generation's window
    counts the short tasks first, so 16 may look better than 8 and be kept: either does the
    same work; 4 or 32 would not."""
    rng = random.Random(7)
    packing = Packing.start(0.0, cap=32)
    running: list[float] = []  # end times
    now = 0.0
    for _ in range(800):
        while len(running) < packing.k:
            slow = max(1.0, len(running) / 8)
            running.append(now + rng.choice((1.0, 1.0, 1.0, 6.0)) * slow)
            packing.running(now, len(running))
        running.sort()
        now = running.pop(0)
        packing.finished(now)
        packing.running(now, len(running))
        if packing.settled:
            break
    assert packing.settled
    assert packing.k in (8, 16), packing.history
    assert [c.why for c in packing.history][:3] == ["start", "raise", "lower"]


def test_an_oom_lowers_k_below_what_ran_and_it_never_rises_past_that() -> None:
    packing = _run(Packing.start(0.0, cap=16), float, 4)
    assert packing.k == 16
    change = packing.oom(10.0, running=4)
    assert change is not None and (change.k, change.why) == (3, "oom")
    _run(packing, float, 100)
    assert max(c.k for c in packing.history[1:]) == 3


def test_memory_caps_k_at_what_runs() -> None:
    packing = Packing.start(0.0, cap=8)
    assert packing.memory(1.0, running=1) is not None
    assert packing.k == 1 and packing.ceiling == 1
    assert packing.memory(2.0, running=1) is None  # no change, no history line


@pytest.mark.parametrize("cap", [1, 2, 3])
def test_k_stays_within_the_cap(cap: int) -> None:
    packing = _run(Packing.start(0.0, cap=cap), float, 100)
    assert max(c.k for c in packing.history) <= cap


def test_a_given_k_never_changes() -> None:
    packing = _run(Packing.start(0.0, cap=16, given=5), float, 100)
    assert packing.oom(1.0, 5) is None and packing.memory(1.0, 2) is None
    assert [(c.k, c.why) for c in packing.history] == [(5, "start")]


def test_calibrate_and_the_farm_walk_one_rule() -> None:
    rates = {1: 1.0, 2: 2.0, 4: 3.9, 8: 4.1, 16: 3.0}
    walk = converge(rates, 16)
    assert walk.k == 4  # 8's 4.1 is within the margin of 4's 3.9: the fewer kept
    assert [c.why for c in walk.history] == ["start", "lower", "lower", "lower", "back-off"]
    assert converge({2: 2.0}, 16).k == 16  # stops at a K not measured: where it starts


# --- memory ---------------------------------------------------------------------------------
def test_the_expected_peak_is_a_high_quantile_of_finished_and_running_peaks() -> None:
    peaks = Peaks([])
    assert peaks.expected() is None
    for gib in (1, 2, 3, 4, 5, 6, 7, 8, 9):
        peaks.add(gib * GIB)
    assert peaks.expected() == 9 * GIB
    assert peaks.expected([20 * GIB]) == 9 * GIB  # one outlier of ten is above the quantile


def test_one_task_that_ended_unseen_does_not_end_learning() -> None:
    """A short task can end between two readings of a busy farm: its zero peak is no proof
    that the command needs no memory, so tasks go on running alone."""
    peaks = Peaks([])
    assert peaks.learning(None, first_started=0.0, now=1.0)
    peaks.add(0)
    assert LEARN_TASKS > 1 and peaks.learning(None, first_started=0.0, now=1.0)
    for _ in range(LEARN_TASKS - 1):
        peaks.add(0)
    assert not peaks.learning(None, first_started=0.0, now=1.0)
    assert not Peaks([]).learning(None, first_started=0.0, now=LEARN_S)
    assert not Peaks([]).learning(2 * GIB, first_started=0.0, now=1.0)


def test_admission_counts_what_running_tasks_may_still_grow_into() -> None:
    reading = Reading(used=20 * GIB, total=80 * GIB, processes={})
    assert admits(reading, 20 * GIB, [20 * GIB])  # 60 free: room for another 20
    assert not admits(reading, 20 * GIB, [20 * GIB, 0, 0])  # two just started: 20 left
    assert admits(None, 20 * GIB, [])
    assert admits(reading, None, [20 * GIB])


@pytest.mark.parametrize(
    "text",
    [
        "CUDA error 2: out of memory (cudaMalloc --alloc-mib)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a "
        "total capacity of 79.19 GiB of which 3.12 GiB is free.",
        "RuntimeError: CUDA error: out of memory",
    ],
)
def test_oom_is_the_text_and_a_full_gpu_together(text: str) -> None:
    total = 80 * GIB
    assert out_of_memory(text, 3 * GIB, total, None)
    assert out_of_memory(text, 20 * GIB, total, 25 * GIB)  # less free than a task needs
    assert not out_of_memory(text, 70 * GIB, total, 25 * GIB)  # a near-empty GPU: its own
    assert not out_of_memory(text, None, total, None)  # NVML never read: not known
    assert not out_of_memory("Segmentation fault", 0, total, None)
    assert margin(total) < 2 * GIB


def test_learnings_clock_starts_with_the_gpus_first_task_not_each_one() -> None:
    """Before any memory is known tasks run alone, for at most LEARN_S after the GPU's first
    task started: a later task alone does not start the clock again."""
    lane = Lane(0, cast(Any, None), None, [1, 2, 3], packing=Packing(cap=16, auto=True, k=4))
    lane.reading = Reading(used=0, total=80 * GIB, processes={})
    lane.first_start = 0.0

    def running(start: float) -> list[Attempt]:
        return [cast(Attempt, SimpleNamespace(start=start, steady=0, peak=0))]

    lane.read_at = 1.0
    assert admits_now(lane, running(0.0)) == (False, None)  # the first task runs alone
    lane.peaks.add(0)  # it ended between two readings: no memory seen
    lane.read_at = LEARN_S - 1
    assert admits_now(lane, running(LEARN_S - 5)) == (False, None)  # the second alone too
    lane.read_at = LEARN_S + 1
    assert admits_now(lane, running(LEARN_S - 5)) == (True, None)  # LEARN_S since the first


def test_a_failed_task_is_judged_on_its_gpu_as_it_ended_however_recent_the_last_reading(
    tmp_path: Path,
) -> None:
    """Two heavy tasks start on an empty GPU; the second runs out of memory and exits before
    the next reading is due (the farm woke within READ_EVERY of the last, as on a busy
    machine), the first's memory seen once, not yet steady. The reap reads the GPU for the
    failed task alone: it is out of memory on a full GPU, not a failure of its own; the
    running task's steadiness and the lane's reading are the regular readings' alone."""
    total, heavy, now = 80 * GIB, 45 * GIB, 10.0
    lane = Lane(0, cast(Any, SimpleNamespace(uuid="GPU-0")), None, [])
    nvml = {"memory_used_bytes": 0, "memory_total_bytes": total, "processes": {}}

    def started(pid: int) -> Attempt:
        rank = cast(Any, SimpleNamespace(ident=SimpleNamespace(pid=pid)))
        return Attempt(cast(Any, None), 1, lane, 0, rank, now, None)

    first, second = started(101), started(102)
    read_memory(lane, [first, second], lambda uuid: nvml, now)  # as both started
    log = tmp_path / "task.err"
    log.write_text("CUDA error 2: out of memory (cudaMalloc --alloc-mib)\n")
    gone: list[Attempt] = []
    farmer = Farmer.__new__(Farmer)
    farmer.usage = lambda uuid: nvml
    farmer.live, farmer.ranks, farmer.undecided = [first, second], [first.rank, second.rank], []
    farmer._cpu = {0: [0.0, 0.0]}
    farmer.procs = cast(
        Any, SimpleNamespace(reap=lambda a: a in gone, ended=lambda done, live: None)
    )
    farmer.recorder = cast(
        Any,
        SimpleNamespace(
            exited=lambda attempt: None,
            dir=SimpleNamespace(log_paths=lambda task, number: [log]),
        ),
    )
    lane.running = 2

    # The first allocates, the second fails for want of memory; the farm's next wake comes
    # within READ_EVERY: its regular reading is skipped.
    nvml.update(memory_used_bytes=heavy, processes={101: heavy})
    second.code = 1
    gone.append(second)
    later = now + READ_EVERY / 2
    read_memory(lane, farmer._mine(lane), farmer.usage, later)  # what _tick does first
    farmer._reap(later)
    assert second in farmer.undecided
    assert second.least_free == total - heavy
    assert farmer._oom(second)
    assert (first.peak, first.steady, lane.read_at) == (0, 0, now)  # as the regular ones left

    # A task alone that held 70 GiB and then asked for more: its own demand, no victim, also
    # once a task that starts after it holds as much.
    alone = started(103)
    alone.peak, alone.least_free, alone.code = 70 * GIB, 10 * GIB, 1
    farmer.live, farmer.ranks, lane.running = [alone], [alone.rank], 1
    nvml.update(memory_used_bytes=70 * GIB, processes={103: 70 * GIB})  # not yet freed
    gone[:] = [alone]
    farmer._reap(now + 1)
    assert alone.least_free == 10 * GIB
    farmer.live = [started(104)]
    farmer.live[0].peak = 70 * GIB
    assert not farmer._oom(alone)
