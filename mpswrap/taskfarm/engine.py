"""The task farm's engine: which task runs next, where, and what comes of each attempt.

K tasks at a time on each GPU (its lane: ``lanes``), each an MPS client of its GPU's daemon,
started and ended by the farm itself (``taskproc``); every event goes to the journal through
the recorder (``recorder``), and every view is a fold of it.

A task's failure does not touch the others. A failed attempt waits ``FAULT_SETTLE`` seconds
for its server.log to name a fatal fault (``faultwatch``): one that ended it makes the attempt
``fault``; one whose output says CUDA ran out of memory while its GPU was (nearly) full makes
it ``oom`` (``admission``; under auto its GPU's K is lowered); else it is ``failed``, or
``timeout`` past ``--timeout``. Whether its task runs again is ``controls.retry_left``;
``--halt`` stops the farm after enough failures (``controls``). On TERM/INT/HUP every running
task is ended through the ladder (terminate_client first), recorded ``interrupted``, and no
new one starts: running the farm again runs them.

Whether a task attached: while it runs, its GPU server's client list is read (at most every
``LIST_EVERY`` seconds a GPU, once a task has run ``ATTACH_FIRST``); a task seen there is
attached; one still unseen after ``--verify-timeout`` is warned about (or, under ``fail``,
ended: exit 69); one that ended before a listing saw it (no CUDA, or too short to list) is
recorded as such (``attached`` null), not as an alarm.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence

from .. import _proc
from .._signals import FORWARDED, SignalTrap
from .._struct import Struct
from ..errors import LayoutError, MpswrapError
from ..job.supervise import (
    VERIFY_FAILED,
    VERIFY_GRACE,
    Rank,
    end_ranks,
    killed_on_error,
    sleep_on,
)
from ..job.verify import Listings
from ..jobenv import PLACE_IN_LAUNCH_VARS
from ..paths import read_job_file
from .admission import out_of_memory
from .controls import NEVER, Halt, after_failure, retry_left
from .faultwatch import is_victim
from .journal import DONE, FAILED, FAULT, INTERRUPTED, OOM, TIMEOUT
from .lanes import (
    Attempt,
    Lane,
    Usage,
    admits_now,
    read_failed,
    read_memory,
    watch_faults,
)
from .packing import Change
from .recorder import Recorder
from .sizing import cpu_floor
from .taskproc import TaskProcs
from .tasks import Task
from .tee import Tee

__all__ = ["FarmPlan", "Farmer"]

log = logging.getLogger(__name__)

#: Seconds a failed attempt waits for its server to log the fault that may have ended it.
FAULT_SETTLE = 1.0
#: The engine's wake when nothing else wakes it: faults looked for, the progress shown.
TICK = 0.25
#: Seconds the tasks' live output (``--tag``) is read for once the farm is over.
TEE_DRAIN = 5.0
#: Bytes of the end of a failed attempt's logs searched for an out-of-memory message.
OOM_TAIL = 64 << 10
#: A task is looked for among its server's clients once it has run this long, and a GPU's
#: clients are listed at most this often (each listing is a control command, served one at a
#: time by the daemon).
ATTACH_FIRST, LIST_EVERY = 0.5, 1.0

#: The client environment of a seat of a lane (``placement.place`` for that GPU).
ClientEnv = Callable[[Lane, int], Mapping[str, str]]


class FarmPlan(Struct, frozen=True):
    """How the farm runs its tasks."""

    retries: int = 0
    grace: float = 10.0
    node: str = ""
    shield: bool = True
    verify: str | None = None
    verify_timeout: float = 30.0
    #: Seconds an attempt may run (None: no limit).
    timeout: float | None = None
    halt: Halt = NEVER
    #: CPUs for each GPU's tasks: K of CPU-light tasks never goes below them (``sizing``).
    cpus_per_gpu: int = 1


class Farmer:
    """Runs ``tasks`` on ``lanes`` until each is done, failed, or the farm is told to stop."""

    def __init__(
        self,
        lanes: Sequence[Lane],
        tasks: Sequence[Task],
        plan: FarmPlan,
        *,
        recorder: Recorder,
        client_env: ClientEnv,
        tee: Tee | None = None,
        usage: Usage | None = None,
    ) -> None:
        self.lanes, self.plan, self.recorder = list(lanes), plan, recorder
        self.client_env, self.tee, self.usage = client_env, tee, usage
        self.tasks = list(tasks)
        self.queue: collections.deque[tuple[Task, int]] = collections.deque((t, 1) for t in tasks)
        self.live: list[Attempt] = []
        self.ranks: list[Rank] = []  # the live attempts' ranks: the ladder's list
        self.undecided: list[Attempt] = []
        self.listings = Listings()
        self.ooms: collections.Counter[int] = collections.Counter()  # task -> oom attempts
        self.stopping = self.halting = False
        self.error: OSError | None = None  # a log or the journal that could not be written
        self.procs = TaskProcs(
            [ln.daemon for ln in lanes if ln.daemon is not None],
            shield=plan.shield,
            grace=plan.grace,
        )
        base = {k: v for k, v in os.environ.items() if k not in PLACE_IN_LAUNCH_VARS}
        self._base = base  # a task is a process of its own, not a rank of the farm's step
        self._envs: dict[tuple[int, int], dict[str, str]] = {}
        #: CPU and wall seconds of each lane's finished attempts (the CPU-light floor of K).
        self._cpu: dict[int, list[float]] = {ln.position: [0.0, 0.0] for ln in lanes}

    @property
    def slots(self) -> int:
        return sum(ln.k for ln in self.lanes)

    def run(self, trap: SignalTrap) -> int:
        """0 once every task ran (each record says how), or 128+signal."""
        with self.procs:
            for lane in self.lanes:  # K's start, in the journal
                if lane.packing is not None:
                    self.recorder.k(lane, lane.packing.last)
            try:
                with killed_on_error(self.ranks):
                    code = self._loop(trap)
                self._tick(final=True)
            finally:
                self._close_tee()
        if self.error is not None:
            if isinstance(self.error, MpswrapError):
                raise self.error
            raise LayoutError(
                "cannot write the farm's files",
                thing=str(self.recorder.dir.path),
                cause=self.error.strerror or str(self.error),
            )
        return code

    def _loop(self, trap: SignalTrap) -> int:
        stopped_by: int | None = None
        while True:
            for sig in trap.pop():
                if sig in FORWARDED:
                    _proc.kill_procs([a.rank.ident for a in self.live], sig)
                elif stopped_by is None:
                    stopped_by = sig
                    self._stop(sig)
            wake = self._tick()
            starting = not self.stopping and not self.halting
            if not (self.live or self.undecided or (starting and self.queue)):
                return 128 + stopped_by if stopped_by is not None else 0
            fds = [a.pidfd for a in self.live]
            watched = [fd for fd in fds if fd is not None]
            extra = self.tee.fds() if self.tee else []
            sleep_on([trap.wake_fd, *watched, *extra], wake if len(watched) == len(fds) else 0.05)

    def _close_tee(self) -> None:
        if self.tee is None:
            return
        self.tee.close(TEE_DRAIN)
        if self.tee.dropped:
            log.warning(
                "--tag: %d line(s) of the tasks' output not shown: the farm's output did not "
                "keep up; the logs in %s have every line",
                self.tee.dropped,
                self.recorder.dir.logs,
            )

    # --- the wake ------------------------------------------------------------------------
    def _tick(self, final: bool = False) -> float:
        now = time.time()
        try:
            if self.tee is not None:
                self.tee.pump()
            for lane in self.lanes:
                # Before the reap: a task that just failed is seen on its GPU as it was (full?)
                if self.usage is not None:
                    read_memory(lane, self._mine(lane), self.usage, now)
            self._reap(now)
            self._watch(now)
            self._decide(now, final)
            if not self.stopping and not self.halting and not self._halt_pending():
                self._fill(now)
            self.recorder.flush(final)
        except OSError as exc:  # disk full, quota: end the running tasks through the ladder
            if self.error is None:
                self.error = exc
                self._stop(signal.SIGTERM, f"cannot write the farm's files ({exc})")
        return TICK

    def _mine(self, lane: Lane) -> list[Attempt]:
        return [a for a in self.live if a.lane is lane]

    def _watch(self, now: float) -> None:
        """Memory, attachment, timeouts and faults of what runs."""
        for lane in self.lanes:
            mine = self._mine(lane)
            self._check_attached(lane, mine, now)
            waiting = any(a.lane is lane for a in self.undecided)
            watch_faults(lane, mine, waiting, now)
        limit = self.plan.timeout
        if limit is None:
            return
        for attempt in self.live:
            if not attempt.ended_by and now - attempt.start >= limit:
                log.warning(
                    "farm: task %d: past --timeout %g s: ending it", attempt.task.number, limit
                )
                self.procs.timeout(attempt, now)
            self.procs.overdue(attempt, now)

    def _stop(self, sig: int, why: str = "") -> None:
        if not self.stopping and not self.halting:
            self._halted(why or _signal_name(sig))
        self.stopping = True
        for attempt in self.live:
            attempt.ended_by = attempt.ended_by or "stop"
        # A signal: the run says it was interrupted, once (``job.run``).
        (log.warning if why else log.debug)(
            "farm: %s: ending %d running task(s), starting no more",
            why or f"signal {sig}",
            len(self.live),
        )
        end_ranks(self.ranks, sig, self.plan.grace)

    def _reap(self, now: float) -> None:
        gone = [a for a in self.live if self.procs.reap(a)]
        if not gone:
            return
        ended = {id(a) for a in gone}
        self.live = [a for a in self.live if id(a) not in ended]
        for attempt in gone:
            self._ended(attempt, now)
        self._read_failed([a for a in gone if a.code != 0 and not a.ended_by])
        self.procs.ended(gone, self.live)

    def _read_failed(self, failed: list[Attempt]) -> None:
        """Each GPU where tasks just failed, read once now, the others' memory still held: a
        task that ran out of memory between two readings is seen on its full GPU (``_oom``)."""
        if self.usage is None:
            return
        for lane in {id(a.lane): a.lane for a in failed}.values():
            mine = [a for a in failed if a.lane is lane]
            read_failed(lane, mine, self._mine(lane), self.usage)

    def _ended(self, attempt: Attempt, now: float) -> None:
        lane = attempt.lane
        self.ranks.remove(attempt.rank)
        lane.seats.append(attempt.seat)
        lane.running -= 1
        lane.holding.discard(id(attempt))
        attempt.end = now
        cpu = self._cpu[lane.position]
        cpu[0], cpu[1] = cpu[0] + attempt.cpu, cpu[1] + attempt.end - attempt.start
        if attempt.ended_by == "stop":
            self.recorder.finish(attempt, INTERRUPTED)
        elif attempt.code == 0 and not attempt.ended_by:
            lane.peaks.add(attempt.peak)
            self.recorder.finish(attempt, DONE)
            self._finished(lane, now)
        else:
            lane.suspect = True
            self.undecided.append(attempt)
            self.recorder.exited(attempt)

    # --- K -------------------------------------------------------------------------------
    def _finished(self, lane: Lane, now: float) -> None:
        if lane.packing is None:
            return
        cpu, wall = self._cpu[lane.position]
        saturated = os.getloadavg()[0] >= self.plan.cpus_per_gpu * len(self.lanes)
        floor = cpu_floor(cpu, wall, self.plan.cpus_per_gpu, lane.packing.cap, saturated=saturated)
        lane.packing.floor = floor
        log.debug("farm: gpu %d: tasks' CPU %.1f s over %.1f s", lane.number, cpu, wall)
        waiting = len(self.queue) / len(self.lanes)  # the queue is every lane's
        self._repack(lane, lane.packing.finished(now, waiting))

    def _repack(self, lane: Lane, change: Change | None) -> None:
        if change is not None and lane.packing is not None:
            self.recorder.k(lane, change)

    def _oom(self, attempt: Attempt) -> bool:
        """Did this failed attempt only run out of memory on a full GPU?"""
        reading = attempt.lane.reading
        if reading is None or attempt.code == 0:
            return False
        text = "".join(
            read_job_file(path, OOM_TAIL, tail=True) or ""
            for path in self.recorder.dir.log_paths(attempt.task, attempt.number)
        )
        return out_of_memory(text, attempt.least_free, reading.total, attempt.others_need)

    # --- failures ------------------------------------------------------------------------
    def _decide(self, now: float, final: bool) -> None:
        """Failed attempts: what ended each (a fault, out of memory, a timeout, itself), once
        its server had time to log a fault; whether its task runs again."""
        for attempt in list(self.undecided):
            status = self._verdict(attempt, now, final)
            if status is None:
                continue
            self.undecided.remove(attempt)
            lane = attempt.lane
            if status == OOM:
                self.ooms[attempt.task.number] += 1
                if lane.packing is not None:
                    self._repack(lane, lane.packing.oom(now, lane.running + 1))
            ooms = self.ooms[attempt.task.number]
            left = retry_left(status, attempt.number, ooms, self.plan.retries)
            status, retry = after_failure(status, left, self.stopping, self.halting)
            retry = retry and not final
            self.recorder.finish(attempt, status, retried=retry)
            if retry:
                self.queue.appendleft((attempt.task, attempt.number + 1))
            if status in (FAILED, TIMEOUT):
                lane.peaks.add(attempt.peak)
                self._finished(lane, now)
            self._halt()  # before the next decision: a halt it reaches leaves no retry
        self._halt()  # the tasks done since the last wake (a halt on success)

    def _verdict(self, attempt: Attempt, now: float, final: bool) -> str | None:
        """FAULT, OOM, TIMEOUT or FAILED; None while its server may still log a fault."""
        watch = attempt.lane.watch
        faults = list(watch.seen.values()) if watch is not None else []
        pids = {attempt.rank.ident.pid}
        if is_victim(pids, attempt.start, attempt.end, faults):
            return FAULT
        if attempt.ended_by == "timeout":
            return TIMEOUT
        if self._oom(attempt):
            return OOM
        if final or watch is None or now - attempt.end >= FAULT_SETTLE:
            if attempt.ended_by == "refused":
                attempt.code = VERIFY_FAILED
            return FAILED
        return None

    def _halt(self) -> None:
        """``--halt``: enough tasks failed for good: no new task (soon), or none running
        either (now)."""
        tally, halt = self.recorder.tally, self.plan.halt
        if self.halting or self.stopping:  # a signal stopped it first: that is its halt
            return
        if not halt.reached(tally.failed, tally.total, tally.done):
            return
        if self.queue or self.live or self.undecided:  # else it ran everything: no halt
            self._halted(f"--halt {halt}")
        self.halting = True
        (log.warning if halt.what == "fail" else log.info)(
            "farm: --halt %s: %d task(s) failed, %d done: %s",
            halt,
            tally.failed,
            tally.done,
            "ending the running ones" if halt.when == "now" else "starting no more",
        )
        if halt.when == "now":
            self._stop(signal.SIGTERM, f"--halt {halt}")

    def _halted(self, why: str) -> None:
        """The journal says the farm starts no more tasks (its ETA then counts the running
        ones only); a farm that cannot write its files stops all the same."""
        with contextlib.suppress(OSError):
            self.recorder.halted(why)

    def _halt_pending(self) -> bool:
        """Whether ``--halt`` would be reached were the attempts still waiting for their
        verdict to fail for good: then no task starts, anywhere, until they are decided."""
        halt, tally = self.plan.halt, self.recorder.tally
        if halt.what == "success" or halt == NEVER or not self.undecided:
            return False
        last = sum(
            not retry_left(FAILED, a.number, self.ooms[a.task.number], self.plan.retries)
            for a in self.undecided
        )
        return halt.reached(tally.failed + last, tally.total, tally.done)

    # --- starting ------------------------------------------------------------------------
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
            takes, change = admits_now(lane, self._mine(lane))
            self._repack(lane, change)
            if not takes:
                full.add(lane.position)
                continue
            task, number = self.queue.popleft()
            lane.seats.sort()
            self._start(task, number, lane, lane.seats.pop(0), now)
            if lane.packing is not None and lane.running:
                lane.packing.running(now, lane.running)

    def _env(self, lane: Lane, seat: int) -> dict[str, str]:
        key = (lane.position, seat)
        if key not in self._envs:
            self._envs[key] = {**self._base, **self.client_env(lane, seat)}
        return self._envs[key]

    def _start(self, task: Task, number: int, lane: Lane, seat: int, now: float) -> None:
        outputs = self._outputs(task, number)
        try:
            rank, fd = self.procs.spawn(task, number, self._env(lane, seat), lane.daemon, outputs)
        except OSError as exc:  # fork failed, the shell missing: a failure of this task alone
            text = exc.render() if isinstance(exc, MpswrapError) else str(exc)
            os.write(outputs[1], f"{text}\n".encode())
            lane.seats.append(seat)
            code = getattr(exc, "exit_code", 126)
            self.recorder.record(
                task, number, lane, status=FAILED, code=code, span=(now, time.time())
            )
            return
        finally:
            os.close(outputs[0])
            os.close(outputs[1])
        attempt = Attempt(task, number, lane, seat, rank, now, fd)
        if lane.reading is not None:
            attempt.least_free = lane.reading.free
        lane.running += 1
        if lane.first_start is None:
            lane.first_start = now
        self.live.append(attempt)
        self.ranks.append(rank)  # before the journal: a journal that cannot be written ends it
        self.recorder.start(attempt)

    def _outputs(self, task: Task, number: int) -> tuple[int, int]:
        """The task's stdout and stderr: its log files, or (``--tag``) pipes to them."""
        logs = self.recorder.dir.open_logs(task, number)
        if self.tee is None:
            return logs
        try:
            return self.tee.attach(str(task.number), *logs)
        finally:
            os.close(logs[0])
            os.close(logs[1])

    # --- attachment ----------------------------------------------------------------------
    def _check_attached(self, lane: Lane, mine: list[Attempt], now: float) -> None:
        """Its server's client list, for the tasks not seen there yet (module's text)."""
        mode = self.plan.verify
        if mode in (None, "off") or lane.daemon is None or now - lane.listed_at < LIST_EVERY:
            return
        unseen = {
            a.rank.ident.pid: a
            for a in mine
            if a.attached is None and not a.ended_by and now - a.start >= _first_check(a)
        }
        if not unseen:
            return
        lane.listed_at = now
        clients = self.listings.clients(lane.daemon)
        for client in clients:
            owner = next((unseen[p] for p in _proc.lineage(client) if p in unseen), None)
            if owner is not None:
                owner.attached = True
        for attempt in unseen.values():  # a container started outside the task's tree
            if attempt.rank.detached and clients & {p.pid for p in attempt.rank.tree()}:
                attempt.attached = True
        for attempt in unseen.values():
            if attempt.attached is None and now - attempt.start >= self.plan.verify_timeout:
                self._unattached(attempt)

    def _unattached(self, attempt: Attempt) -> None:
        attempt.attached = False
        error = MpswrapError(
            f"task {attempt.task.number} is not an MPS client",
            thing=f"pid {attempt.rank.ident.pid}",
            cause=f"not among its GPU server's clients after {self.plan.verify_timeout:g} s",
            hint="it runs without MPS: does it (or a wrapper script) set "
            "CUDA_MPS_PIPE_DIRECTORY? raise --verify-timeout if CUDA starts late",
        )
        if self.plan.verify != "fail":
            log.warning("%s; hint: %s", error.line(), error.hint)
            return
        log.error("%s: ending it", error.line())
        attempt.ended_by = "refused"
        end_ranks([attempt.rank], signal.SIGTERM, min(self.plan.grace, VERIFY_GRACE))


def _first_check(attempt: Attempt) -> float:
    """How long a task runs before its GPU's clients are listed for it: at once for a
    container runtime that starts its container outside the task's tree and may return."""
    return 0.0 if attempt.rank.detached else ATTACH_FIRST


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
