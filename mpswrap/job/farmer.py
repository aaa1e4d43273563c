"""The task farm's engine: K tasks at a time on each GPU, each an MPS client of its GPU's
daemon, started, watched and ended like the launcher's ranks (``supervise``).

A task's failure does not touch the others. A failed attempt waits ``FAULT_SETTLE`` seconds
for its server.log to name a fatal fault (``faultwatch``): if one ended it, the attempt is
recorded as ``fault`` and the task goes back to the front of the queue while it has retries
left; else it is recorded as ``failed``. A GPU whose server faulted takes no new task (the
server refuses clients meanwhile) until server.log says it recovered or the tasks the fault
named have exited (``HOLD_MAX`` at most), and ``RECOVER_WAIT`` more. On TERM/INT/HUP every
running task is ended through the ladder (terminate_client first) and no new one starts;
those ended are not recorded, so running the farm again runs them.

K, the tasks at once on a GPU, is its lane's ``Packing``: given, or found as the farm runs
(auto; the rule in ``packing``). With auto, each wake also reads the GPUs' memory through
NVML (``usage``): a GPU takes another task only while its free memory covers the peak its
tasks are expected to need (``gpumemory``). A failed attempt whose output says CUDA ran out
of memory while its GPU was (nearly) full is recorded as ``oom``, not ``failed``, and its
task goes back to the queue, up to ``OOM_TRIES`` runs; under auto its GPU's K is lowered.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence

from .. import _proc
from .._signals import Guard, SignalTrap
from .._struct import Struct, field
from ..errors import LayoutError, MpswrapError
from ..jobenv import PLACE_IN_LAUNCH_VARS
from ..mps.daemon import Daemon
from ..paths import read_job_file
from .faultwatch import ATTEMPT_VAR, TASK_VAR, FaultWatch, is_victim
from .gpumemory import Peaks, Reading, admits, out_of_memory
from .outcomes import Outcome
from .packing import Change, Packing
from .placement import Slot
from .supervise import (
    VERIFY_FAILED,
    Rank,
    end_leftovers,
    end_ranks,
    guard_ranks,
    killed_on_error,
    spawn_rank,
    watch,
)
from .tasks import DONE, FAILED, FAULT, OOM, OOM_TRIES, FarmDir, Task, TaskRecord
from .tee import Tee
from .verify import Listings, Verifier

__all__ = ["Counts", "FarmPlan", "Farmer", "Lane"]

log = logging.getLogger(__name__)

#: Seconds a failed attempt waits for its server to log the fault that may have ended it.
FAULT_SETTLE = 1.0
#: Seconds a GPU waits, once the clients of a fault have exited, before it takes tasks again.
RECOVER_WAIT = 0.5
#: Seconds a GPU waits at most for its server to recover from a fault (a client that never
#: exits keeps it in FAULT): then it takes tasks again, which a server still in FAULT refuses.
HOLD_MAX = 60.0
#: The engine's wake: faults are looked for, the progress shown.
TICK = 0.25
#: Seconds the tasks' live output (``--tag``) is read for once the farm is over.
TEE_DRAIN = 5.0
#: Bytes of the end of a failed attempt's logs searched for an out-of-memory message.
OOM_TAIL = 64 << 10


class Lane(Struct):
    """One GPU of the farm: its free seats and whether its server may take clients."""

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
    #: NVML's last reading of the GPU's memory (None: none taken), and the tasks' peaks.
    reading: Reading | None = None
    peaks: Peaks = field(default_factory=lambda: Peaks([]))
    running: int = 0

    @property
    def k(self) -> int:
        return self.packing.k if self.packing else self.running + len(self.seats)

    def takes(self, now: float) -> bool:
        return (
            bool(self.seats)
            and self.running < self.k
            and self.paused_at is None
            and now >= self.resume_at
        )


class Attempt(Struct):
    """One run of a task."""

    task: Task
    number: int
    lane: Lane
    seat: int
    rank: Rank
    start: float
    pids: set[int]
    guard: Guard | None = None
    check: Verifier | None = None
    end: float = 0.0
    code: int = 0
    #: Running when the farm was told to stop: ended by it, not recorded.
    stopped: bool = False
    #: The most GPU memory its processes held at one reading; the least free memory of its
    #: GPU read while it ran (None: none read).
    peak: int = 0
    least_free: int | None = None
    #: What it held at the last reading, and its peak once a reading showed no growth: a
    #: task seen between its CUDA context and its first allocation is not yet a peak to go by.
    held: int = 0
    steady: int = 0


class FarmPlan(Struct, frozen=True):
    """How the farm runs its tasks."""

    retries: int
    grace: float
    node: str
    shield: bool = True
    verify: str | None = None
    verify_timeout: float = 30.0


class Counts(Struct):
    """Where the farm stands, for the progress line, ``farm status`` and the summary."""

    total: int
    started: float
    done: int = 0
    failed: int = 0
    #: Tasks that ran out of memory on every try.
    oom: int = 0
    retried: int = 0
    #: When each running attempt started: kept equal to the attempts running, whenever the
    #: set changes, so that a line printed at any moment counts what runs then.
    since: list[float] = field(default_factory=list)
    #: Tasks at once: K on each GPU.
    slots: int = 0
    #: Seconds the finished attempts took, and how many they are (the ETA's mean).
    busy: float = 0.0
    attempts: int = 0

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.oom

    @property
    def running(self) -> int:
        return len(self.since)

    def count(self, status: str, seconds: float, retried: bool) -> None:
        """One finished attempt."""
        self.busy += seconds
        self.attempts += 1
        if status == DONE:
            self.done += 1
        elif retried:
            self.retried += 1
        elif status == OOM:
            self.oom += 1
        else:
            self.failed += 1


#: The client environment of a seat of a lane (``placement.place`` for that GPU).
ClientEnv = Callable[[Lane, int], Mapping[str, str]]
#: Told of each finished attempt (None: only the counts moved, at each wake).
Report = Callable[[TaskRecord | None, Counts], None]
#: NVML's figures of a GPU (``mps.gpu.usage`` of its UUID); None: NVML not asked.
Usage = Callable[[str], "Mapping[str, object] | None"]
#: Told of each change of a GPU's K: the lane, its change before, and the new one.
Repacked = Callable[[Lane, Change, Change], None]


class Farmer:
    """Runs ``tasks`` on ``lanes`` until each is done, failed, or the farm is told to stop."""

    def __init__(
        self,
        lanes: Sequence[Lane],
        tasks: Sequence[Task],
        plan: FarmPlan,
        *,
        farm_dir: FarmDir,
        client_env: ClientEnv,
        report: Report,
        ended: Callable[[Outcome], None] | None = None,
        tee: Tee | None = None,
        usage: Usage | None = None,
        repacked: Repacked | None = None,
    ) -> None:
        self.lanes, self.plan, self.dir = list(lanes), plan, farm_dir
        self.client_env, self.report = client_env, report
        #: The tasks' output, live (``--tag``); None: straight to their log files.
        self.tee = tee
        #: Each attempt's outcome, as it ends (the run record; ``outcomes`` keeps them too).
        self.ended = ended
        self.tasks = list(tasks)
        self.queue: collections.deque[tuple[Task, int]] = collections.deque((t, 1) for t in tasks)
        self.settled: set[int] = set()  # task numbers done, or failed for good
        self.live: list[Attempt] = []
        self.ranks: list[Rank] = []  # the live attempts' ranks: watch()'s list
        self.checks: list[Verifier] = []
        self.undecided: list[Attempt] = []
        self.listings = Listings()
        self.records: list[TaskRecord] = []
        self.outcomes: list[Outcome] = []
        self.counts = Counts(len(tasks), time.time(), slots=sum(ln.k for ln in lanes))
        self.stopping = False
        self.error: OSError | None = None  # a log or the state that could not be written
        #: NVML's memory figures of a GPU, read at each wake where a lane's K is auto.
        self.usage = usage
        self.repacked = repacked
        self.ooms: collections.Counter[int] = collections.Counter()  # task -> oom attempts

    def run(self, trap: SignalTrap) -> int:
        """0 once every task ran (each record says how), or 128+signal."""
        for lane in self.lanes:  # K's start, in the journal (``farm status``)
            if lane.packing is not None:
                self._repack(lane, lane.packing.last)
        try:
            with killed_on_error(self.ranks):
                code = watch(
                    self.ranks,
                    trap,
                    grace=self.plan.grace,
                    checks=self.checks,
                    on_terminate=self._stop,
                    tick=self._tick,
                    isolated=True,
                    more=self._more,
                    readable=self.tee.fds if self.tee else None,
                )
            self._tick()
            self._decide(time.time(), final=True)
        finally:
            for guard in (a.guard for a in self.live):
                if guard is not None:
                    guard.release()
            if self.tee is not None:
                self.tee.close(TEE_DRAIN)
                if self.tee.dropped:
                    log.warning(
                        "--tag: %d line(s) of the tasks' output not shown: the farm's output "
                        "did not keep up; the logs in %s have every line",
                        self.tee.dropped,
                        self.dir.path / "logs",
                    )
        if self.error is not None:
            if isinstance(self.error, MpswrapError):
                raise self.error
            raise LayoutError(
                "cannot write the farm's files",
                thing=str(self.dir.path),
                cause=self.error.strerror or str(self.error),
            )
        return code

    @property
    def not_run(self) -> list[Task]:
        """Tasks that neither succeeded nor failed for good: queued, or ended by a signal."""
        return [t for t in self.tasks if t.number not in self.settled]

    # --- the wake ------------------------------------------------------------------------
    def _tick(self) -> float:
        now = time.time()
        try:
            if self.tee is not None:
                self.tee.pump()
            self._read_memory(now)
            self._reap(now)
            self._watch_lanes(now)
            self._decide(now)
            if not self.stopping:
                self._fill(now)
            self.report(None, self.counts)
        except OSError as exc:  # disk full, quota: end the running tasks through the ladder
            if self.error is None:
                self.error = exc
                self._stop(signal.SIGTERM, f"cannot write the farm's files ({exc})")
        return TICK

    def _ended(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if self.ended is not None:
            self.ended(outcome)

    def _more(self) -> bool:
        return not self.stopping and bool(self.queue or self.undecided or self.live)

    def _stop(self, sig: int, why: str = "") -> None:
        self.stopping = True
        for attempt in self.live:
            attempt.stopped = True
        # A signal: the run says it was interrupted, once (``job.run``).
        (log.warning if why else log.debug)(
            "farm: %s: ending %d running task(s), starting no more",
            why or f"signal {sig}",
            len(self.live),
        )
        end_ranks(self.ranks, sig, self.plan.grace)

    def _live(self, attempts: list[Attempt]) -> None:
        """The running attempts, and the counts' view of them, changed together."""
        self.live = attempts
        self.counts.since = [a.start for a in attempts]

    def _reap(self, now: float) -> None:
        end_leftovers(self.ranks)  # a task's tree ends with it
        gone = [a for a in self.live if not a.rank.running()]
        self._live([a for a in self.live if all(a is not g for g in gone)])  # before any shows
        for attempt in gone:
            self.ranks.remove(attempt.rank)
            if attempt.guard is not None:
                attempt.guard.release()
            attempt.end = now
            attempt.code = attempt.rank.code()
            if attempt.check is not None:
                self.checks.remove(attempt.check)
                attempt.code = VERIFY_FAILED if attempt.check.refused else attempt.code
            attempt.lane.seats.append(attempt.seat)
            attempt.lane.running -= 1
            attempt.lane.holding.discard(id(attempt))
            self._ended(_outcome(attempt))
            if attempt.stopped:
                continue
            if attempt.code == 0:
                attempt.lane.peaks.add(attempt.peak)
                self._record(attempt, DONE)
                self._finished(attempt.lane, now)
            else:
                attempt.lane.suspect = True
                self.undecided.append(attempt)

    # --- K and memory --------------------------------------------------------------------
    def _read_memory(self, now: float) -> None:
        """NVML's reading of each lane's GPU; each running task's peak, and the least free
        memory its GPU had while it ran."""
        if self.usage is None:
            return
        for lane in self.lanes:
            lane.reading = Reading.of(self.usage(lane.slot.uuid))
            reading = lane.reading
            mine = [a for a in self.live if a.lane is lane]
            if reading is None or not mine:
                continue
            held = _held_by(mine, reading)
            for attempt in mine:
                now_held = held.get(id(attempt), 0)
                attempt.peak = max(attempt.peak, now_held)
                if now_held and now_held <= attempt.held:
                    attempt.steady = attempt.peak
                attempt.held = now_held
                least = attempt.least_free
                attempt.least_free = reading.free if least is None else min(least, reading.free)

    def _expected(self, lane: Lane) -> int | None:
        return lane.peaks.expected(a.steady for a in self.live if a.lane is lane)

    def _admits(self, lane: Lane, now: float) -> bool:
        """Whether the GPU's free memory takes another task (always, with none running)."""
        if lane.packing is None or not lane.packing.auto or not lane.running:
            return True
        if lane.reading is None:  # NVML gives no memory figures: nothing to go by
            return True
        mine = [a for a in self.live if a.lane is lane]
        expected = self._expected(lane)
        if lane.peaks.learning(expected, min(a.start for a in mine), now):
            return False
        if admits(lane.reading, expected, [a.peak for a in mine]):
            return True
        self._repack(lane, lane.packing.memory(now, lane.running))
        return False

    def _finished(self, lane: Lane, now: float) -> None:
        if lane.packing is not None:
            waiting = len(self.queue) / len(self.lanes)  # the queue is every lane's
            self._repack(lane, lane.packing.finished(now, waiting))

    def _repack(self, lane: Lane, change: Change | None) -> None:
        if change is None or lane.packing is None:
            return
        history = lane.packing.history
        before = history[-2] if len(history) > 1 else change
        self.dir.event(
            "k",
            gpu=lane.slot.uuid,
            gpu_index=lane.position,
            node=self.plan.node,
            auto=lane.packing.auto,
            **change.to_json(),
        )
        self.counts.slots = sum(ln.k for ln in self.lanes)
        if self.repacked is not None:
            self.repacked(lane, before, change)

    def _oom(self, attempt: Attempt) -> bool:
        """Did this failed attempt only run out of memory on a full GPU?"""
        reading = attempt.lane.reading
        if reading is None or attempt.code == 0:
            return False
        text = "".join(
            read_job_file(path, OOM_TAIL, tail=True) or ""
            for path in self.dir.log_paths(attempt.task, attempt.number)
        )
        return out_of_memory(text, attempt.least_free, reading.total, self._expected(attempt.lane))

    def _watch_lanes(self, now: float) -> None:
        """server.log is read where a task failed or a fault is being handled; a fault stops
        its GPU taking tasks until its server recovers."""
        for lane in self.lanes:
            waiting = any(a.lane is lane for a in self.undecided)
            if lane.watch is None or not (lane.suspect or waiting or lane.paused_at is not None):
                continue
            lane.suspect = False
            new = lane.watch.refresh()
            if new:
                named = set().union(*(f.pids for f in new))
                mine = [a for a in self.live if a.lane is lane]
                hit = [a for a in mine if {p.pid for p in a.rank.tree()} & named]
                lane.holding = {id(a) for a in hit or mine}  # a shell's client is its child
                lane.paused_at = lane.paused_at or now
                log.warning(
                    "farm: gpu %d: fatal GPU fault: its tasks are retried; no new task "
                    "there until its server recovers",
                    lane.position,
                )
            if lane.paused_at is not None and self._recovered(lane, now):
                for fault in lane.watch.unrecovered():
                    fault.recovered_at = now
                lane.paused_at, lane.holding = None, set()
                lane.resume_at = now + RECOVER_WAIT

    def _recovered(self, lane: Lane, now: float) -> bool:
        assert lane.watch is not None
        assert lane.paused_at is not None
        if not lane.holding or all(f.logged_recovery for f in lane.watch.unrecovered()):
            return True
        if now - lane.paused_at < HOLD_MAX:
            return False
        log.warning(
            "farm: gpu %d: no recovery from the fault after %g s: taking tasks again",
            lane.position,
            HOLD_MAX,
        )
        return True

    def _decide(self, now: float, final: bool = False) -> None:
        """Failed attempts: a fault's victims are retried (while retries are left), the rest
        recorded as failed once their server had time to log a fault."""
        for attempt in list(self.undecided):
            watch_ = attempt.lane.watch
            faults = list(watch_.seen.values()) if watch_ is not None else []
            if is_victim(attempt.pids, attempt.start, attempt.end, faults):
                self.undecided.remove(attempt)
                retry = attempt.number <= self.plan.retries and not final and not self.stopping
                self._record(attempt, FAULT, retried=retry)
                if retry:
                    self.queue.appendleft((attempt.task, attempt.number + 1))
            elif self._oom(attempt):
                self.undecided.remove(attempt)
                self.ooms[attempt.task.number] += 1
                tries = self.ooms[attempt.task.number] < OOM_TRIES
                retry = tries and not final and not self.stopping
                self._record(attempt, OOM, retried=retry)
                if retry:
                    self.queue.appendleft((attempt.task, attempt.number + 1))
                if attempt.lane.packing is not None:
                    change = attempt.lane.packing.oom(now, attempt.lane.running + 1)
                    self._repack(attempt.lane, change)
            elif final or watch_ is None or now - attempt.end >= FAULT_SETTLE:
                self.undecided.remove(attempt)
                attempt.lane.peaks.add(attempt.peak)
                self._record(attempt, FAILED)
                self._finished(attempt.lane, now)

    def _fill(self, now: float) -> None:
        full: set[int] = set()  # lanes whose memory takes no more now
        for lane in self.lanes:
            if lane.packing is not None:
                lane.packing.running(now, lane.running)
        while self.queue:
            open_lanes = [ln for ln in self.lanes if ln.takes(now) and ln.position not in full]
            if not open_lanes:
                return
            lane = max(open_lanes, key=lambda ln: (ln.k - ln.running, -ln.position))
            if not self._admits(lane, now):
                full.add(lane.position)
                continue
            task, number = self.queue.popleft()
            lane.seats.sort()
            self._start(task, number, lane, lane.seats.pop(0))
            if lane.packing is not None and lane.running:
                lane.packing.running(now, lane.running)

    # --- one attempt ---------------------------------------------------------------------
    def _start(self, task: Task, number: int, lane: Lane, seat: int) -> None:
        out, err = self._outputs(task, number)
        # A process of its own, not a rank of the step that runs the farm.
        env = {k: v for k, v in os.environ.items() if k not in PLACE_IN_LAUNCH_VARS}
        env.update(self.client_env(lane, seat))
        env.update({TASK_VAR: str(task.number), ATTEMPT_VAR: str(number)})
        start = time.time()
        try:
            rank = spawn_rank(
                task.argv,
                env,
                lane.daemon,
                shield=self.plan.shield,
                name=f"task {task.number}",
                stdout=out,
                stderr=err,
                stdin=_proc.DEVNULL,
            )
        except OSError as exc:  # not found, not executable: a failure of this task alone
            text = exc.render() if isinstance(exc, MpswrapError) else str(exc)
            os.write(err, f"{text}\n".encode())
            lane.seats.append(seat)
            code = getattr(exc, "exit_code", 126)
            self._record_parts(
                task, number, lane, status=FAILED, span=(start, time.time()), code=code
            )
            self._ended(Outcome(code, None, 0, start))  # counted as a shell counts it
            return
        finally:
            os.close(out)
            os.close(err)
        attempt = Attempt(task, number, lane, seat, rank, start, {rank.ident.pid})
        if self.plan.verify not in (None, "off") and lane.daemon is not None:
            attempt.check = Verifier(
                rank, lane.daemon, self.plan.verify_timeout, str(self.plan.verify), self.listings
            )
            self.checks.append(attempt.check)
        if lane.reading is not None:
            attempt.least_free = lane.reading.free
        lane.running += 1
        self._live([*self.live, attempt])
        self.ranks.append(rank)  # before its guard: a failed fork still ends it, by the ladder
        attempt.guard = guard_ranks([rank], self.plan.grace)
        # Once it is watched: a journal that cannot be written stops the farm, through the
        # ladder for this task too.
        self.dir.event(
            "start",
            task=task.number,
            key=task.key,
            line=task.line,
            attempt=number,
            node=self.plan.node,
            gpu=lane.slot.uuid,
            gpu_index=lane.position,
            time=start,
        )

    def _outputs(self, task: Task, number: int) -> tuple[int, int]:
        """The task's stdout and stderr: its log files, or (``--tag``) pipes to them."""
        logs = self.dir.open_logs(task, number)
        if self.tee is None:
            return logs
        try:
            return self.tee.attach(str(task.number), *logs)
        finally:
            os.close(logs[0])
            os.close(logs[1])

    def _record(self, attempt: Attempt, status: str, retried: bool = False) -> None:
        self._record_parts(
            attempt.task,
            attempt.number,
            attempt.lane,
            status=status,
            code=attempt.code,
            span=(attempt.start, attempt.end),
            retried=retried,
        )

    def _record_parts(
        self,
        task: Task,
        number: int,
        lane: Lane,
        *,
        status: str,
        code: int,
        span: tuple[float, float],
        retried: bool = False,
    ) -> None:
        out, err = self.dir.log_paths(task, number)
        record = TaskRecord(
            task.number,
            task.key,
            task.command,
            number,
            status,
            code,
            self.plan.node,
            lane.slot.uuid,
            lane.position,
            span[0],
            span[1],
            str(out),
            str(err),
            retried,
        )
        self.dir.append(record)
        self.records.append(record)
        if not retried:
            self.settled.add(task.number)
        self.counts.count(status, record.seconds, retried)
        self.report(record, self.counts)


def _held_by(attempts: Sequence[Attempt], reading: Reading) -> dict[int, int]:
    """id(attempt) -> the GPU memory its processes hold (a shell's client is its child)."""
    roots = {a.rank.ident.pid: id(a) for a in attempts}
    out: dict[int, int] = {}
    for pid, size in reading.processes.items():
        owner = next((roots[p] for p in _proc.lineage(pid) if p in roots), None)
        if owner is not None:
            out[owner] = out.get(owner, 0) + size
    return out


def _outcome(attempt: Attempt) -> Outcome:
    """For the node's summary line."""
    check = attempt.check
    listed = None if check is None else check.listed or attempt.rank.ended > 0
    return Outcome(attempt.code, listed, attempt.rank.ended, attempt.start)
