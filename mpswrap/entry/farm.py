"""``mpswrap farm TASKS``: many independent runs packed onto this job's GPUs through MPS.

K tasks at a time per GPU (``--per-gpu``), each one MPS client of its GPU's daemon, started,
checked and ended as the launcher's ranks are (``job.farmer``). The daemons are the
prolog's, or started here in user mode and stopped at the end, as ``mpswrap run`` does.
Tasks, logs and the resume record: ``job.tasks``. Across nodes, inside an allocation,
``srun --ntasks-per-node=1 mpswrap farm TASKS`` gives each task of the step a disjoint share
(task numbers modulo the step's task count), which it packs onto its node's GPUs.

Exit code: 0 when every task of the share is done (now or before), 1 when any failed or did
not run, 128+signal after TERM/INT/HUP (every running task ended through terminate_client).
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from .._lock import file_lock
from ..errors import LockTimeout, UsageError
from ..job.farmer import Counts, Farmer, FarmPlan, Lane
from ..job.faultwatch import FaultWatch
from ..job.run import LaunchOptions, Plan, Started, execute, plan
from ..job.tasks import FarmDir, Share, Task, TaskRecord, parse_share, parse_tasks, read_tasks
from ..jobenv import JobEnv
from ..report.farmview import Progress, summary_lines
from ..report.summary import print_summary

__all__ = ["FarmOptions", "FarmResult", "default_per_gpu", "farm", "run_farm"]

log = logging.getLogger(__name__)

#: The default K never exceeds this: beyond it small tasks gain little and each needs a CPU.
PER_GPU_BOUND = 16


@dataclass(frozen=True)
class FarmOptions:
    """What ``mpswrap farm`` adds to the launch options."""

    per_gpu: int | None = None
    retries: int = 1
    directory: str | None = None
    share: str | None = None
    progress: str = "auto"


@dataclass
class FarmResult:
    """What a farm did: its exit code, every attempt's record, what did not run."""

    code: int
    records: list[TaskRecord] = field(default_factory=list)
    not_run: list[Task] = field(default_factory=list)
    skipped: int = 0
    directory: str = ""


def default_per_gpu(limit: int, n_gpus: int, cpus: int) -> int:
    """K when not given: at most the client limit, a CPU per task, and ``PER_GPU_BOUND``."""
    return max(1, min(limit, cpus // max(1, n_gpus), PER_GPU_BOUND))


def _share(given: str | None, env: JobEnv) -> Share:
    if given is not None:
        return parse_share(given)
    task = env.step_task
    return Share() if task is None else Share(*task)


def _directory(given: str | None, source: str) -> str:
    """``--dir``, else ``<TASKS>.farm`` beside the task list (``stdin.farm`` here for ``-``):
    two task lists never share one by default."""
    if given:
        return given
    return "stdin.farm" if source == "-" else f"{source}.farm"


def run_farm(opts: LaunchOptions, farm_opts: FarmOptions, source: str) -> int:
    """``mpswrap farm``: the exit code; the summary on stdout."""
    _check(farm_opts)  # bad options before a missing task list
    result = farm_tasks(
        opts, farm_opts, read_tasks(source), _directory(farm_opts.directory, source)
    )
    return result.code


def farm(
    tasks: Sequence[str],
    *,
    directory: str = "mpswrap.farm",
    per_gpu: int | None = None,
    retries: int = 1,
    gpus: str | None = None,
    threads: str | None = None,
    share: str | None = None,
    progress: str = "off",
) -> FarmResult:
    """Run ``tasks`` (command lines, as the lines of a task list) on this job's GPUs, as
    ``mpswrap farm`` does: ``per_gpu`` at a time on each GPU, logs and state in ``directory``
    (tasks done there before are skipped), ``retries`` more runs of a task a fatal GPU fault
    ended. Prints the summary; returns a ``FarmResult`` (``code``: 0 when every task is done,
    1 when any failed or did not run, 128+N after signal N). Usage errors raise ``UsageError``.
    """
    opts = LaunchOptions(gpus=gpus, threads=threads)
    farm_opts = FarmOptions(per_gpu, retries, directory, share, progress)
    _check(farm_opts)
    return farm_tasks(opts, farm_opts, parse_tasks(tasks), directory)


def farm_tasks(
    opts: LaunchOptions, farm_opts: FarmOptions, tasks: list[Task], directory: str
) -> FarmResult:
    """The farm of checked ``farm_opts`` (``_check``): both callers check before reading."""
    env = JobEnv.current()
    share = _share(farm_opts.share, env)
    farm_dir = FarmDir(directory, share)
    mine = [t for t in tasks if share.picks(t)]
    done = farm_dir.finished() if farm_dir.path.is_dir() else set()
    todo = [t for t in mine if t.key not in done]
    result = FarmResult(0, skipped=len(mine) - len(todo), directory=directory)
    if share.count > 1:
        log.info("farm: share %s: %d of %d task(s)", share, len(mine), len(tasks))
    if not mine:
        print(f"farm: no tasks to run (share {share} of {len(tasks)} task(s))")
        return result
    if not todo:
        print(f"farm: nothing to run: {len(mine)} task(s), all done before ({directory})")
        return result
    planned = plan(opts, "farm")
    per_gpu = _per_gpu(planned, farm_opts.per_gpu, len(todo))
    if opts.dry_run:
        _print_plan(todo, directory, per_gpu, planned)
        return result
    farm_dir.create()
    with _only_farm(farm_dir):
        view = Progress(farm_opts.progress)
        engines: list[Farmer] = []

        def body(run: Started) -> int:
            farmer = _farmer(
                run, farm_opts=farm_opts, per_gpu=per_gpu, todo=todo, farm_dir=farm_dir, view=view
            )
            engines.append(farmer)
            return farmer.run(run.trap)

        try:
            code = execute(planned, body, summary=print_summary)
        finally:
            view.close()
    return _result(result, engines[0] if engines else None, code, farm_dir, todo)


@contextmanager
def _only_farm(farm_dir: FarmDir) -> Iterator[None]:
    """The share's lock: two farms on one directory and share would run every task twice."""
    held = file_lock(farm_dir.lock_path, timeout=0)
    try:
        held.acquire()
    except LockTimeout:
        raise UsageError(
            "another farm runs in this directory",
            thing=str(farm_dir.path),
            hint="wait for it, or give --dir another directory",
        ) from None
    try:
        yield
    finally:
        held.release()


def _farmer(
    run: Started,
    *,
    farm_opts: FarmOptions,
    per_gpu: int,
    todo: list[Task],
    farm_dir: FarmDir,
    view: Progress,
) -> Farmer:
    """The engine for this farm: a lane of ``per_gpu`` seats on each GPU the run uses."""
    planned = run.plan
    opts, settings = planned.opts, planned.settings
    plan_ = FarmPlan(
        retries=farm_opts.retries,
        grace=opts.grace_s(settings),
        node=planned.env.node,
        shield=not opts.no_shield,
        verify=opts.verify_mode(settings),
        verify_timeout=opts.verify_timeout,
    )
    daemons = [run.daemon(s) for s in planned.slots]
    lanes = [
        Lane(i, s, d, list(range(per_gpu)), FaultWatch(d))
        for i, (s, d) in enumerate(zip(planned.slots, daemons, strict=True))
    ]
    log.info(
        "farm: %d task(s), %d at a time on each of %d GPU(s), logs in %s",
        len(todo),
        per_gpu,
        len(lanes),
        farm_dir.logs,
    )

    def client_env(lane: Lane, seat: int) -> dict[str, str]:
        return planned.place(seat, per_gpu, policy="block", slots=[lane.slot]).env

    return Farmer(
        lanes,
        todo,
        plan_,
        farm_dir=farm_dir,
        client_env=client_env,
        report=view.report,
        ended=run.ended,
    )


def _result(
    result: FarmResult, farmer: Farmer | None, code: int, farm_dir: FarmDir, todo: list[Task]
) -> FarmResult:
    """The summary on stdout, and the exit code; every task not run where a signal came
    before the first one started (``farmer`` None)."""
    result.records = farmer.records if farmer else []
    result.not_run = farmer.not_run if farmer else list(todo)
    counts: Counts = farmer.counts if farmer else Counts(len(todo), time.time())
    for line in summary_lines(
        result.records, result.not_run, result.skipped, counts, str(farm_dir.path)
    ):
        print(line, flush=True)
    failed = counts.failed or result.not_run
    result.code = code if code else (1 if failed else 0)
    return result


def _per_gpu(planned: Plan, given: int | None, tasks: int) -> int:
    """K: as given, or ``default_per_gpu``, on as many GPUs as there are tasks (at most the
    run's); refused when K more clients would not fit on each."""
    gpus = min(tasks, len(planned.slots))
    planned.use(gpus, "block", gpus=gpus)
    cpus = len(planned.env.cpus_allowed or ()) or os.cpu_count() or 1
    per_gpu = given or default_per_gpu(max(1, planned.free()), gpus, cpus)
    planned.use(per_gpu * gpus, "block")
    return per_gpu


def _check(farm_opts: FarmOptions) -> None:
    if farm_opts.per_gpu is not None and farm_opts.per_gpu < 1:
        raise UsageError("bad --per-gpu", thing=str(farm_opts.per_gpu), cause="need at least 1")
    if farm_opts.retries < 0:
        raise UsageError("bad --retries", thing=str(farm_opts.retries), cause="must be >= 0")
    if farm_opts.progress not in ("auto", "bar", "lines", "off"):
        raise UsageError(
            "bad --progress", thing=farm_opts.progress, hint="use auto, bar, lines or off"
        )
    if farm_opts.share is not None:
        parse_share(farm_opts.share)


def _print_plan(todo: list[Task], directory: str, per_gpu: int, planned: Plan) -> None:
    """``--dry-run``: what would run, and how; nothing is started or written."""
    for task in todo:
        print(f"[task {task.number}] {shlex.join(task.argv)}")
    print(
        f"farm: {len(todo)} task(s) would run, {per_gpu} at a time on each of "
        f"{len(planned.slots)} GPU(s); logs and state in {directory}"
    )
