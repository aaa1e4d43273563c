"""``mpswrap farm TASKS``: many independent runs packed onto this job's GPUs through MPS.

K tasks at a time per GPU (``--per-gpu``), each one MPS client of its GPU's daemon, started,
checked and ended as the launcher's ranks are (``farm.engine``). The daemons are the
prolog's, or started here in user mode and stopped at the end, as ``mpswrap run`` does.
Tasks, logs and the resume record: ``farm.tasks``. Across nodes, inside an allocation,
``srun --ntasks-per-node=1 mpswrap farm TASKS`` gives each task of the step a disjoint share
(task numbers modulo the step's task count), which it packs onto its node's GPUs.

Exit code: 0 when every task of the share is done (now or before), 1 when any failed or did
not run, 128+signal after TERM/INT/HUP (every running task ended through terminate_client).

The command prints its summary on stdout; ``mpswrap.farm()`` prints nothing: it returns the
records and sends the same lines to the ``mpswrap.entry.farm`` logger. ``farm_status`` is
``mpswrap farm status``: what the farm's journal says (``farm.status``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from .. import _proc
from .._lock import file_lock
from .._struct import Struct
from ..errors import LayoutError, LockTimeout, UsageError
from ..job.job import Released
from ..job.run import LaunchOptions, Plan, Started, execute, plan
from ..jobenv import JobEnv
from ..mps.gpu import usage
from ..report import plots
from ..report.summary import node_summary, print_summary
from ..taskfarm import status as farmstatus
from ..taskfarm.engine import Counts, Farmer, FarmPlan, Lane
from ..taskfarm.faultwatch import FaultWatch
from ..taskfarm.packing import Change, Packing, start_k
from ..taskfarm.sizing import auto_cap, per_gpu_value
from ..taskfarm.tasks import (
    WHOLE,
    FarmDir,
    Share,
    Task,
    TaskRecord,
    parse_share,
    parse_tasks,
    read_journal,
    read_tasks,
)
from ..taskfarm.tee import Tee
from ..taskfarm.view import Progress, k_line, summary_lines

__all__ = [
    "FarmOptions",
    "FarmResult",
    "farm",
    "farm_status",
    "run_farm",
]

log = logging.getLogger(__name__)


class FarmOptions(Struct, frozen=True):
    """What ``mpswrap farm`` adds to the launch options."""

    per_gpu: int | None = None  # None: auto
    retries: int = 1
    directory: str | None = None
    share: str | None = None
    progress: str = "auto"
    #: Each task's output lines, live, tagged with its number (``--tag``).
    tag: bool = False


@dataclass
class FarmResult:
    """What a farm did: its exit code, every attempt's record, what did not run."""

    code: int
    records: list[TaskRecord] = field(default_factory=list)
    not_run: list[Task] = field(default_factory=list)
    skipped: int = 0
    directory: str = ""


def _share(given: str | None, env: JobEnv) -> Share:
    if given is not None:
        return parse_share(given)
    task = env.step_task
    return WHOLE if task is None else Share(*task)


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
        opts, farm_opts, read_tasks(source), _directory(farm_opts.directory, source), _SHOW
    )
    return result.code


def farm(
    tasks: Sequence[str],
    *,
    directory: str = "mpswrap.farm",
    per_gpu: int | str | None = None,
    retries: int = 1,
    gpus: str | None = None,
    threads: str | None = None,
    share: str | None = None,
    progress: str = "off",
) -> FarmResult:
    """Run ``tasks`` (command lines, as the lines of a task list) on this job's GPUs, as
    ``mpswrap farm`` does: ``per_gpu`` at a time on each GPU (None or ``"auto"``: found as
    the farm runs), logs and state in ``directory``
    (tasks done there before are skipped), ``retries`` more runs of a task a fatal GPU fault
    ended. Prints nothing: the summary (and, unless ``progress`` is ``off``, a line per
    finished attempt) goes to the ``mpswrap.entry.farm`` logger at INFO. Returns a
    ``FarmResult`` (``code``: 0 when every task is done, 1 when any failed or did not run,
    128+N after signal N). Usage errors (a bad task line too) raise ``UsageError``.
    """
    opts = LaunchOptions(gpus=gpus, threads=threads)
    farm_opts = FarmOptions(per_gpu_value(per_gpu), retries, directory, share, progress)
    _check(farm_opts)
    return farm_tasks(opts, farm_opts, parse_tasks(tasks, "tasks"), directory, _LOG)


class _Show(Struct, frozen=True):
    """Where a farm's words go: the command's stdout and stderr, or the API's log."""

    line: Callable[[str], None]
    progress: Callable[[str], Progress]
    summary: Callable[[Released], None]


def _log_summary(done: Released) -> None:
    node = node_summary(done)
    if node is not None and node.outcomes:
        log.info("%s", node.line())


_SHOW = _Show(lambda text: print(text, flush=True), Progress, print_summary)
_LOG = _Show(
    lambda text: log.info("%s", text),
    lambda mode: Progress(mode, emit=lambda text: log.info("%s", text)),
    _log_summary,
)


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
    done = farm_dir.finished() if farm_dir.path.is_dir() else set()
    todo = [t for t in mine if t.key not in done]
    result = FarmResult(0, skipped=len(mine) - len(todo), directory=directory)
    if share.count > 1:
        log.info("farm: share %s: %d of %d task(s)", share, len(mine), len(tasks))
    if not mine:
        show.line(f"farm: no tasks to run (share {share} of {len(tasks)} task(s))")
        return result
    if not todo:
        show.line(f"farm: nothing to run: {len(mine)} task(s), all done before ({directory})")
        return result
    planned = plan(opts, "farm")
    seats = _per_gpu(planned, farm_opts.per_gpu, len(todo))
    for task in todo:  # a task that starts a container that would miss its daemon
        try:
            planned.check_container(task.argv)
        except UsageError as exc:
            raise exc.with_context(f"task {task.number}") from None
    if opts.dry_run:
        _print_plan(todo, directory, farm_opts.per_gpu, seats, planned)
        return result
    farm_dir.create()
    with _only_farm(farm_dir):
        view = show.progress(farm_opts.progress)
        engines: list[Farmer] = []

        def body(run: Started) -> int:
            farmer = _farmer(
                run, farm_opts=farm_opts, seats=seats, todo=todo, farm_dir=farm_dir, view=view
            )
            engines.append(farmer)
            _begin(farm_dir, run, farmer, result.skipped, farm_opts.retries)
            return farmer.run(run.trap)

        try:
            code = execute(planned, body, summary=show.summary)
        finally:
            view.close()
        result = _result(result, engines[0] if engines else None, code, farm_dir, todo, show=show)
        farm_dir.event("end", time=time.time(), code=result.code)
    return result


def _begin(farm_dir: FarmDir, run: Started, farmer: Farmer, skipped: int, retries: int) -> None:
    """The journal's ``farm`` event: who runs this share now, and what it has to do."""
    me = _proc.identify(os.getpid())
    farm_dir.event(
        "farm",
        time=farmer.counts.started,
        node=run.plan.env.node,
        pid=os.getpid(),
        pid_start=me.start_time if me else 0.0,
        share=str(farm_dir.share),
        todo=farmer.counts.total,
        skipped=skipped,
        gpus=len(farmer.lanes),
        slots=farmer.counts.slots,
        retries=retries,
    )


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
    seats: int,
    todo: list[Task],
    farm_dir: FarmDir,
    view: Progress,
) -> Farmer:
    """The engine for this farm: a lane of ``seats`` seats on each GPU the run uses, K of
    them used at once (given, or found: ``packing``)."""
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
    now = time.time()
    lanes = [
        Lane(
            i,
            s,
            d,
            list(range(seats)),
            FaultWatch(d),
            packing=Packing.start(now, seats, farm_opts.per_gpu),
        )
        for i, (s, d) in enumerate(zip(planned.slots, daemons, strict=True))
    ]
    log.info(
        "farm: %d task(s), %s on each of %d GPU(s), logs in %s",
        len(todo),
        _k_words(farm_opts.per_gpu, seats),
        len(lanes),
        farm_dir.logs,
    )

    def client_env(lane: Lane, seat: int) -> dict[str, str]:
        return planned.place(seat, seats, policy="block", slots=[lane.slot]).env

    def repacked(lane: Lane, before: Change, change: Change) -> None:
        if change.why != "start":
            view.note(k_line(lane.position, before, change))

    return Farmer(
        lanes,
        todo,
        plan_,
        farm_dir=farm_dir,
        client_env=client_env,
        report=view.report,
        ended=run.ended,
        tee=Tee(sys.stdout, sys.stderr) if farm_opts.tag else None,
        usage=lambda uuid: usage(uuid, settings.gpu_inventory),
        repacked=repacked,
    )


def _k_words(given: int | None, seats: int) -> str:
    if given is not None:
        return f"{given} at a time"
    return f"K found as it runs (auto: from {start_k(seats)}, at most {seats})"


def _result(
    result: FarmResult,
    farmer: Farmer | None,
    code: int,
    farm_dir: FarmDir,
    todo: list[Task],
    *,
    show: _Show,
) -> FarmResult:
    """The summary (``show``), and the exit code; every task not run where a signal came
    before the first one started (``farmer`` None)."""
    result.records = farmer.records if farmer else []
    result.not_run = farmer.not_run if farmer else list(todo)
    counts: Counts = farmer.counts if farmer else Counts(len(todo), time.time())
    packing = {
        lane.position: lane.packing.history
        for lane in (farmer.lanes if farmer else [])
        if lane.packing is not None
    }
    for line in summary_lines(
        result.records, result.not_run, result.skipped, counts, str(farm_dir.path), packing=packing
    ):
        show.line(line)
    failed = counts.failed or counts.oom or result.not_run
    result.code = code if code else (1 if failed else 0)
    return result


def _per_gpu(planned: Plan, given: int | None, tasks: int) -> int:
    """The seats on each GPU: K as given, or the most auto goes to (``auto_cap``), on as
    many GPUs as there are tasks (at most the run's); refused when they would not fit."""
    gpus = min(tasks, len(planned.slots))
    planned.use(gpus, "block", gpus=gpus)
    cpus = len(planned.env.cpus_allowed or ()) or os.cpu_count() or 1
    seats = given or auto_cap(max(1, planned.free()), gpus, cpus)
    planned.use(seats * gpus, "block")
    return seats


def _check(farm_opts: FarmOptions) -> None:
    per_gpu_value(farm_opts.per_gpu)
    if farm_opts.retries < 0:
        raise UsageError("bad --retries", thing=str(farm_opts.retries), cause="must be >= 0")
    if farm_opts.progress not in ("auto", "bar", "lines", "off"):
        raise UsageError(
            "bad --progress", thing=farm_opts.progress, hint="use auto, bar, lines or off"
        )
    if farm_opts.share is not None:
        parse_share(farm_opts.share)


def _print_plan(
    todo: list[Task], directory: str, given: int | None, seats: int, planned: Plan
) -> None:
    """``--dry-run``: what would run, and how; nothing is started or written."""
    for task in todo:
        print(f"[task {task.number}] {task.command}")
    print(
        f"farm: {len(todo)} task(s) would run, {_k_words(given, seats)} on each of "
        f"{len(planned.slots)} GPU(s); logs and state in {directory}"
    )


def farm_status(directory: str | None, as_json: bool, plot: str | None = None) -> int:
    """``mpswrap farm status [DIR]``: what the farm's journal says, from any shell. DIR: a
    farm's directory, or its task list (``<TASKS>.farm``); none: the one ``*.farm`` here.
    ``plot``: also save K and throughput over time there (``report.plots``)."""
    if plot:
        plots.pyplot()  # refused before anything is read or printed
    path = _status_dir(directory)
    try:
        journal = read_journal(path)
    except LayoutError as exc:
        raise UsageError(exc.what, thing=exc.thing, cause=exc.cause, hint=_STATUS_HINT) from None
    if not journal:
        raise UsageError("not a farm directory (no state file)", thing=path, hint=_STATUS_HINT)
    alive = farmstatus.process_alive(JobEnv.current().node)
    shares = [farmstatus.fold(name, lines, alive) for name, lines in journal.items()]
    now = time.time()
    record = farmstatus.status_json(path, shares, now)
    if as_json:
        print(json.dumps(record, indent=1))
    else:
        for line in farmstatus.status_lines(path, shares, now):
            print(line)
    if plot:
        plots.plot_packing(record, plot, title=f"farm {path}")
        print(f"farm status: plot saved to {plot}", file=sys.stderr if as_json else sys.stdout)
    return 0


_STATUS_HINT = "give the farm's directory (--dir, default <TASKS>.farm) or its task list"


def _status_dir(given: str | None) -> str:
    if given is not None:
        return given if not os.path.isfile(given) else _directory(None, given)
    here = sorted(n for n in os.listdir(".") if n.endswith(".farm") and os.path.isdir(n))
    if len(here) != 1:
        found = f"found {', '.join(here)}" if here else "none here"
        raise UsageError("which farm?", cause=f"{found}", hint=_STATUS_HINT)
    return here[0]
