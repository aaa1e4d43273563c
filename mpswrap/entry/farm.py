"""``mpswrap farm TASKS``: many independent runs packed onto this job's GPUs through MPS.

K tasks at a time per GPU (``--per-gpu``), each one MPS client of its GPU's daemon, started,
checked and ended by the farm's engine (``taskfarm.engine``). The daemons are the prolog's, or
started here in user mode and stopped at the end, as ``mpswrap run`` does. Tasks, logs and the
journal: ``taskfarm``. Across nodes, inside an allocation, ``srun --ntasks-per-node=1 mpswrap
farm TASKS`` gives each task of the step a disjoint share (task numbers modulo the step's task
count), which it packs onto its node's GPUs.

Exit code: 0 when every task of the share is done (now or before), 1 when any failed or did
not run, 128+signal after TERM/INT/HUP (every running task ended through terminate_client and
recorded as interrupted).

The command prints its summary on stdout (``-q``: only where something failed or did not run);
``mpswrap.farm()`` prints nothing: it returns the records and sends the same lines to the
``mpswrap.entry.farm`` logger. ``mpswrap farm status``: ``entry.farmstatus``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from .._lock import file_lock
from .._struct import Struct
from ..errors import LockTimeout, UsageError
from ..job.job import Released
from ..job.run import LaunchOptions, Plan, Result, Run, plan
from ..jobenv import JobEnv
from ..mps.gpu import usage
from ..paths import farm_profile
from ..report.summary import emit, node_summary
from ..taskfarm.controls import parse_halt
from ..taskfarm.engine import Farmer, FarmPlan
from ..taskfarm.faultwatch import FaultWatch
from ..taskfarm.journal import (
    DONE,
    FAILED,
    FAULT,
    INTERRUPTED,
    OOM,
    TIMEOUT,
    FarmDir,
    TaskRecord,
)
from ..taskfarm.lanes import Lane
from ..taskfarm.packing import Packing, start_k
from ..taskfarm.profile import Profile
from ..taskfarm.recorder import Recorder, outcomes
from ..taskfarm.sizing import auto_cap, per_gpu_value
from ..taskfarm.tasks import WHOLE, Share, Task, parse_share, parse_tasks, read_tasks
from ..taskfarm.tee import Tee
from ..taskfarm.view import HEARTBEAT, Progress
from ..taskfarm.words import summary_lines

__all__ = ["FarmOptions", "FarmResult", "farm", "run_farm", "task_list_dir"]

log = logging.getLogger(__name__)


class FarmOptions(Struct, frozen=True):
    """What ``mpswrap farm`` adds to the launch options."""

    per_gpu: int | None = None  # None: auto
    retries: int = 0
    directory: str | None = None
    share: str | None = None
    progress: str = "auto"
    #: Each task's output lines, live, tagged with its number (``--tag``).
    tag: bool = False
    #: Seconds a task may run (None: no limit).
    timeout: float | None = None
    halt: str = "never"
    #: On a farm run again, tasks that failed there before stay failed (not run again).
    skip_failed: bool = False
    heartbeat: float = HEARTBEAT


@dataclass
class FarmResult:
    """What a farm did: its exit code, every attempt's record, what did not run."""

    code: int
    records: list[TaskRecord] = field(default_factory=list)
    not_run: list[Task] = field(default_factory=list)
    #: Tasks not run because a record of the directory settled them: done before, and
    #: (``--skip-failed``) failed before, which keep the exit code 1.
    skipped: int = 0
    failed_before: int = 0
    directory: str = ""


def _share(given: str | None, env: JobEnv) -> Share:
    if given is not None:
        return parse_share(given)
    task = env.step_task
    return WHOLE if task is None else Share(*task)


def task_list_dir(given: str | None, source: str) -> str:
    """``--dir``, else ``<TASKS>.farm`` beside the task list (``stdin.farm`` here for ``-``
    and for a pipe named by a path in /dev or /proc, as ``<(...)`` names one): two task
    lists never share one by default."""
    if given:
        return given
    piped = source == "-" or os.path.abspath(source).startswith(("/dev/", "/proc/"))
    return "stdin.farm" if piped else f"{source}.farm"


def run_farm(opts: LaunchOptions, farm_opts: FarmOptions, source: str) -> int:
    """``mpswrap farm``: the exit code; the summary on stdout."""
    _check(farm_opts)  # bad options before a missing task list
    directory = task_list_dir(farm_opts.directory, source)
    return farm_tasks(opts, farm_opts, read_tasks(source), directory, _SHOW).code


def farm(
    tasks: Sequence[str],
    *,
    directory: str = "mpswrap.farm",
    per_gpu: int | str | None = None,
    retries: int = 0,
    gpus: str | None = None,
    threads: str | None = None,
    share: str | None = None,
    progress: str = "off",
    timeout: float | None = None,
    halt: str = "never",
    skip_failed: bool = False,
) -> FarmResult:
    """Run ``tasks`` (command lines, as the lines of a task list) on this job's GPUs, as
    ``mpswrap farm`` does: ``per_gpu`` at a time on each GPU (None or ``"auto"``: found as
    the farm runs), logs and journal in ``directory`` (tasks done there before are skipped;
    ``skip_failed``: those that failed there too), ``retries`` more runs of a task that
    fails (GPU faults and out-of-memory have their own), ``timeout`` seconds a task may run,
    ``halt`` as ``--halt``. Prints nothing: the summary (and, unless ``progress`` is ``off``,
    a line per finished attempt) goes to the ``mpswrap.entry.farm`` logger at INFO. Returns
    a ``FarmResult`` (``code``: 0 when every task is done, 1 when any failed (before, where
    ``skip_failed``) or did not run, except those a halt on success left, 128+N after signal
    N). Usage errors (a bad task line too) raise ``UsageError``.
    """
    opts = LaunchOptions(gpus=gpus, threads=threads)
    farm_opts = FarmOptions(
        per_gpu_value(per_gpu),
        retries,
        directory,
        share,
        progress,
        timeout=timeout,
        halt=halt,
        skip_failed=skip_failed,
    )
    _check(farm_opts)
    return farm_tasks(opts, farm_opts, parse_tasks(tasks, "tasks"), directory, _LOG)


class _Show(Struct, frozen=True):
    """Where a farm's words go: the command's stdout and stderr, or the API's log."""

    line: Callable[[str], None]
    progress: Callable[[FarmOptions, bool], Progress]
    node: Callable[[str], None]
    #: The API keeps every record for its result; the command's memory stays flat.
    keep_records: bool = False


def _view(farm_opts: FarmOptions, quiet: bool) -> Progress:
    mode = "quiet" if quiet and farm_opts.progress != "off" else farm_opts.progress
    return Progress(mode, heartbeat=farm_opts.heartbeat)


def _api_view(farm_opts: FarmOptions, quiet: bool) -> Progress:
    return Progress(farm_opts.progress, emit=lambda text: log.info("%s", text))


_SHOW = _Show(
    lambda text: print(text, flush=True), _view, lambda text: print(text, file=sys.stderr)
)
_LOG = _Show(lambda text: log.info("%s", text), _api_view, lambda text: log.info("%s", text), True)


def _quiet() -> bool:
    """``-q``: only problems are shown."""
    return not logging.getLogger("mpswrap").isEnabledFor(logging.INFO)


def farm_tasks(
    opts: LaunchOptions,
    farm_opts: FarmOptions,
    tasks: list[Task],
    directory: str,
    show: _Show = _SHOW,
) -> FarmResult:
    """The farm of checked ``farm_opts`` (``_check``): both callers check before reading."""
    env = JobEnv.current()
    share = _share(farm_opts.share, env)
    farm_dir = FarmDir(directory, share)
    mine = [t for t in tasks if share.picks(t)]
    todo, failed_before = _todo(mine, farm_dir, farm_opts.skip_failed)
    result = FarmResult(
        1 if failed_before else 0,
        skipped=len(mine) - len(todo),
        failed_before=failed_before,
        directory=directory,
    )
    if share.count > 1:
        log.info("farm: share %s: %d of %d task(s)", share, len(mine), len(tasks))
    if not mine:
        if not _quiet():
            of = f" (share {share} of {len(tasks)} task(s))" if share.count > 1 else ""
            show.line(f"farm: no tasks to run{of}")
        return result
    if not todo:
        before = "all done before"
        if failed_before:
            before = f"{len(mine) - failed_before} done before, {failed_before} failed before"
            before += " (--skip-failed)"
        if failed_before or not _quiet():
            show.line(f"farm: nothing to run: {_tasks(len(mine))}, {before} ({directory})")
        return result
    planned, seats = _per_gpu(plan(opts, "farm"), farm_opts.per_gpu, len(todo))
    for task in todo:  # a task that starts a container that would miss its daemon
        try:
            planned.check_container(task.argv)
        except UsageError as exc:
            raise exc.with_context(f"task {task.number}") from None
    farm_dir.check()  # a dry run refuses what the farm would
    if opts.dry_run:
        _print_plan(todo, directory, farm_opts.per_gpu, seats, planned)
        return result
    farm_dir.create()
    with _only_farm(farm_dir):
        return _run(
            planned,
            farm_opts=farm_opts,
            todo=todo,
            farm_dir=farm_dir,
            seats=seats,
            result=result,
            show=show,
            listed=len(tasks),
        )


def _todo(mine: list[Task], farm_dir: FarmDir, skip_failed: bool) -> tuple[list[Task], int]:
    """The tasks to run: not done in the directory before (nor failed, ``skip_failed``); and
    how many of those not run failed before."""
    if not farm_dir.path.is_dir():
        return mine, 0
    last = farm_dir.last_status()
    failed = {FAILED, FAULT, OOM, TIMEOUT} if skip_failed else set()
    todo = [t for t in mine if last.get(t.key) not in {DONE, *failed}]
    return todo, sum(last.get(t.key) in failed for t in mine)


def _run(
    planned: Plan,
    *,
    farm_opts: FarmOptions,
    todo: list[Task],
    farm_dir: FarmDir,
    seats: int,
    result: FarmResult,
    show: _Show,
    listed: int,
) -> FarmResult:
    """The farm itself (``listed``: the whole task list's length, for ``farm status``)."""
    quiet = _quiet()
    view = show.progress(farm_opts, quiet)
    profile = Profile(farm_profile(planned.settings.farm_profile))
    farmer: Farmer | None = None

    def summary(done: Released) -> None:
        tally = farmer.recorder.tally if farmer else None
        node = node_summary(done, outcomes(tally) if tally else None, noun="task")
        problems = tally is not None and bool(
            tally.failed or (tally.not_run and not _stopped_as_asked(farmer))
        )
        if node is None or not node.outcomes or (quiet and not problems):
            return
        if show.keep_records:  # the API: its log, not stderr
            show.node(node.line())
        else:
            emit(node)

    try:
        with Run(planned, summary=summary) as run:
            run.result = run.stopped
            if run.result is None:
                recorder = Recorder(
                    farm_dir,
                    run.plan.env.node,
                    view=view,
                    ended=run.ended,
                    keep_records=show.keep_records,
                )
                farmer = _farmer(
                    run, farm_opts, seats=seats, todo=todo, recorder=recorder, profile=profile
                )
                recorder.begin(
                    len(todo),
                    result.skipped - result.failed_before,
                    farmer.slots,
                    failed_before=result.failed_before,
                    listed=listed,
                    gpus=len(farmer.lanes),
                    job=run.plan.env.job_id,
                )
                try:
                    run.result = Result(farmer.run(run.trap))
                finally:
                    view.close()  # the bar's line ends before the node's summary line
    finally:
        view.close()
        if farmer is not None:
            farmer.recorder.close()
    if farmer is None:  # a signal before the first task started
        result.not_run, result.code = list(todo), run.code or 1
        return result
    return _finish(farmer, run.code, todo=todo, result=result, show=show, profile=profile)


def _finish(
    farmer: Farmer,
    code: int,
    *,
    todo: list[Task],
    result: FarmResult,
    show: _Show,
    profile: Profile,
) -> FarmResult:
    """The summary (``show``), the journal's ``end``, the profile, and the exit code."""
    tally = farmer.recorder.tally
    result.records = list(tally.records or [])
    settled = {t for t, status in tally.settled.items() if status != INTERRUPTED}
    result.not_run = [t for t in todo if t.number not in settled]
    as_asked = _stopped_as_asked(farmer)
    failed = bool(tally.failed or result.failed_before or (result.not_run and not as_asked))
    result.code = code if code else (1 if failed else 0)
    until = time.time()  # the summary's end is the journal's: its fold says the same
    ended = result.code
    try:
        if not _quiet() or failed:
            for line in summary_lines(tally, result.not_run, str(farmer.recorder.dir.path), until):
                show.line(line)
    except BrokenPipeError:  # its reader left (`farm | head`): the exit code main gives it
        ended = 128 + signal.SIGPIPE
        raise
    finally:  # a summary nobody reads still leaves the journal whole, with the code it exits
        farmer.recorder.end(ended, until)
        profile.learn_farm(farmer.lanes, farmer.tasks, tally)
    return result


def _stopped_as_asked(farmer: Farmer | None) -> bool:
    """A halt on success (or done) left the tasks unrun as asked: they make no failure."""
    return farmer is not None and farmer.halting and farmer.plan.halt.what != "fail"


@contextmanager
def _only_farm(farm_dir: FarmDir) -> Iterator[None]:
    """The share's lock: two farms on one directory and share would run every task twice."""
    held = file_lock(farm_dir.lock_path, timeout=0)
    try:
        held.acquire()
    except LockTimeout:
        raise farm_dir.busy() from None
    try:
        yield
    finally:
        held.release()


def _farmer(
    run: Run,
    farm_opts: FarmOptions,
    *,
    seats: int,
    todo: list[Task],
    recorder: Recorder,
    profile: Profile,
) -> Farmer:
    """The engine for this farm: a lane of ``seats`` seats on each GPU the run uses, K of
    them used at once (given, or found: ``packing``; known tasks start at the profile's)."""
    planned = run.plan
    opts, settings = planned.opts, planned.settings
    plan_ = FarmPlan(
        retries=farm_opts.retries,
        grace=opts.grace_s(settings),
        node=planned.env.node,
        shield=not opts.no_shield,
        verify=opts.verify_mode(settings),
        verify_timeout=opts.verify_timeout,
        timeout=farm_opts.timeout,
        halt=parse_halt(farm_opts.halt),
        cpus_per_gpu=max(1, planned.env.cpu_count // max(1, len(planned.slots))),
    )
    now = time.time()
    known = profile.of(t.command for t in todo) if farm_opts.per_gpu is None else None
    lanes = []
    for i, slot in enumerate(planned.slots):
        daemon = run.daemon(slot)
        packing = Packing.start(now, seats, farm_opts.per_gpu)
        lane = Lane(i, slot, daemon, list(range(seats)), FaultWatch(daemon), packing=packing)
        if known is not None:
            known.start(lane, now)
        lanes.append(lane)
    log.info(
        "farm: %d task(s), %s on each of %d GPU(s), logs in %s",
        len(todo),
        _k_words(farm_opts.per_gpu, seats),
        len(lanes),
        recorder.dir.logs,
    )

    def client_env(lane: Lane, seat: int) -> dict[str, str]:
        return planned.place(seat, seats, policy="block", slots=[lane.slot]).env

    return Farmer(
        lanes,
        todo,
        plan_,
        recorder=recorder,
        client_env=client_env,
        tee=Tee(sys.stdout, sys.stderr) if farm_opts.tag else None,
        usage=lambda uuid: usage(uuid, settings.gpu_inventory),
    )


def _k_words(given: int | None, seats: int) -> str:
    if given is not None:
        return f"{given} at a time"
    return f"K found as it runs (auto: from {start_k(seats)}, at most {seats})"


def _per_gpu(planned: Plan, given: int | None, tasks: int) -> tuple[Plan, int]:
    """The plan on as many GPUs as there are tasks (at most the run's), and the seats on
    each GPU: K as given, or the most auto goes to (``auto_cap``); refused when they would
    not fit."""
    gpus = min(tasks, len(planned.slots))
    planned = planned.use(gpus, "block", gpus=gpus)
    seats = given or auto_cap(max(1, planned.free()), gpus, planned.env.cpu_count)
    return planned.use(seats * gpus, "block"), seats


def _check(farm_opts: FarmOptions) -> None:
    per_gpu_value(farm_opts.per_gpu)
    if farm_opts.retries < 0:
        raise UsageError("bad --retries", thing=str(farm_opts.retries), cause="must be >= 0")
    if farm_opts.progress not in ("auto", "bar", "lines", "off"):
        raise UsageError(
            "bad --progress", thing=farm_opts.progress, hint="use auto, bar, lines or off"
        )
    if farm_opts.timeout is not None and not farm_opts.timeout > 0:
        raise UsageError("bad --timeout", thing=str(farm_opts.timeout), cause="must be > 0")
    parse_halt(farm_opts.halt)
    if farm_opts.share is not None:
        parse_share(farm_opts.share)


def _print_plan(
    todo: list[Task], directory: str, given: int | None, seats: int, planned: Plan
) -> None:
    """``--dry-run``: what would run, and how; nothing is started or written."""
    for task in todo:
        print(f"[task {task.number}] {task.command}")
    print(
        f"farm: {_tasks(len(todo))} would run, {_k_words(given, seats)} on each of "
        f"{len(planned.slots)} GPU(s); logs and journal in {directory}"
    )


def _tasks(n: int) -> str:
    return f"{n} task" if n == 1 else f"{n} tasks"
