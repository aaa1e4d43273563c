"""The launcher front end: prefix mode (``mpswrap srun|mpirun ...``) and per-rank mode
(``srun mpswrap ./app``, ``mpirun -np 8 mpswrap ./app``).

- prefix: refuse what cannot fit before launching, then run the launcher with ``mpswrap --``
  inserted before each program (``launchargs``), handing signals to it, and return its exit
  code;
- per rank: one run of the run lifecycle (``job.run``) whose body supervises this rank's
  program (``job.supervise``).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import time
from collections.abc import Mapping

from .. import _proc
from .._signals import SignalTrap
from .._struct import replace
from .._wait import end_procs
from ..errors import InventoryFileError, MpswrapError
from ..job import launchargs
from ..job.launchers import SRUN, TORCHRUN, daemon_names, launcher_of
from ..job.run import LaunchOptions, Result, Run, local_position, plan
from ..job.supervise import Rank, check_program, supervise, watch
from ..jobenv import LOCAL_RANK_VARS, RANK_VARS_VAR, JobEnv
from ..report.summary import print_summary

__all__ = ["LaunchOptions", "per_rank", "prefix"]

log = logging.getLogger(__name__)


# --- per-rank mode -------------------------------------------------------------------------
def per_rank(opts: LaunchOptions, command: list[str]) -> int:
    """One rank: plan, attach, place, supervise (``job.run``); the node's last rank to leave
    prints its summary (ranks of one node that do not overlap in time print one each)."""
    planned = plan(opts, "rank", rank=True)
    rank, size, policy = local_position(planned.env, planned.policy)
    planned = planned.use(size, policy)  # every local rank of this launch
    planned.check_program(command)
    if opts.dry_run:
        print(planned.dry_run_line(rank, size, command, policy=policy))
        return 0
    with Run(planned, summary=print_summary, counted=True, announce=False) as run:
        run.result = run.stopped or _supervised(run, command, rank, size, policy)
    if run.result and run.result.refused:  # not a program's own exit code 69
        _end_fellow_tasks(planned.env)
    return run.code


def _supervised(run: Run, command: list[str], rank: int, size: int, policy: str) -> Result:
    """The rank's program, a client of its GPU's daemon, supervised to its end."""
    planned, settings = run.plan, run.plan.settings
    opts = planned.opts
    found = planned.place(rank, size, policy=policy)
    outcome = supervise(
        command,
        {**os.environ, **found.env},
        daemon=run.daemon(found.slot),
        grace=opts.grace_s(settings),
        shield=not opts.no_shield,
        verify_attach=opts.verify_mode(settings),
        verify_timeout=opts.verify_timeout,
        start=run.start,
        name=f"rank {rank if planned.env.rank is None else planned.env.rank}",
    )
    run.ended(outcome)
    return Result(outcome.code, refused=outcome.refused)


def _end_fellow_tasks(env: JobEnv) -> None:
    """``--verify-attach fail`` ends the run, as ``mpswrap run`` and mpirun do. srun leaves
    its other tasks running when one fails, so this task's supervisor asks Slurm to SIGTERM
    the step: each of them ends its rank through the ladder. This one is done and ignores it."""
    if env.srun_step is None:
        return
    from ..slurm.scontrol import signal_step  # only here: a rank's start stays light

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if signal_step(env, signal.SIGTERM, daemon_names()):
        log.error("ending the other tasks of step %s: a rank ran without MPS", env.srun_step)


# --- prefix mode ---------------------------------------------------------------------------
def prefix(opts: LaunchOptions, argv: list[str]) -> int:
    row = launcher_of(argv[0]) if argv else None
    line = launchargs.parse(argv, python=_worker_python(argv[0]) if row is TORCHRUN else "")
    assert row is not None  # parse refused any other
    settings = opts.settings()
    env = dict(os.environ)
    exported = [v for s in line.segments for v in s.values("export")]
    if any(not v.startswith("ALL") for v in exported):  # srun passes only what it names
        log.warning(
            "srun --export=%s: MPSWRAP_* settings reach the ranks only if named there", exported[-1]
        )
    # srun outside an allocation: its ranks get the new job's SLURM_JOB_ID; every other
    # launcher's ranks share a job named here.
    known = JobEnv(env)
    job = known.job_key(opts.job) if row is SRUN else known.run_job(opts.job, row.names[0])
    _check_launch(line, opts, env, job)
    extra = _launch_env(line, env, job)
    env.update(extra)
    exports: list[str] = []
    if row.export_option:  # remote ranks get only what it names
        for name in sorted(n for n in env if n.startswith("MPSWRAP_")):
            exports += [row.export_option, name]
    rewritten = line.argv(opts.rank_argv(job), exports)
    if opts.dry_run:
        for name, value in sorted(extra.items()):
            print(f"{name}={shlex.quote(value)}")
        print(shlex.join(rewritten))
        return 0
    if job:
        log.info("job %s: launching %s", job, rewritten[0])
    settle = float(opts.grace_s(settings) + settings.terminate_timeout + 5)
    return _run_launcher(rewritten, env, settle)


def _launch_env(
    line: launchargs.CommandLine, env: Mapping[str, str], job: str | None
) -> dict[str, str]:
    """Variables for the launcher and every rank (the job id also goes on the ranks' command
    line: argv survives ``srun --export=NONE``)."""
    extra: dict[str, str] = {"MPSWRAP_JOB": job} if job else {}
    row = launcher_of(line.launcher)
    if row is not None and _outranked(row.local_rank[0]):  # its ranks' own first (JobEnv)
        extra[RANK_VARS_VAR] = f"{row.local_rank[0]},{row.local_size[0]}"
    for name, value in (row.rank_env if row else {}).items():
        mca = name.removeprefix("OMPI_MCA_")  # also given as ``--mca NAME VALUE``
        given = any(v == mca for s in line.segments for v in s.values("mca"))
        if not given and name not in env:
            extra[name] = value
    return extra


def _outranked(name: str) -> bool:
    """Whether the local-rank variable ``name`` comes after ``SLURM_LOCALID``, which every
    rank a launcher starts inside a Slurm job inherits (torchrun's ``LOCAL_RANK``)."""
    order = LOCAL_RANK_VARS.index
    return name in LOCAL_RANK_VARS and order(name) > order("SLURM_LOCALID")


def _worker_python(launcher: str) -> str:
    """The interpreter torchrun would run its workers' script with: its own (the first line
    of the torchrun script on PATH), else ``python3``."""
    found = shutil.which(launcher)
    try:
        with open(found or "", "rb") as handle:
            first = handle.readline(4096).decode(errors="replace").strip()
    except OSError:
        return "python3"
    words = first.removeprefix("#!").split()
    if not first.startswith("#!") or not words:
        return "python3"
    found = words[-1] if os.path.basename(words[0]) == "env" else words[0]
    return found if os.path.basename(found).startswith("python") else "python3"


def _check_launch(
    line: launchargs.CommandLine, opts: LaunchOptions, env: Mapping[str, str], job: str | None
) -> None:
    """Refuse before launch what the ranks would refuse: a request over a limit or a bad
    value (2), the command line's ranks per node placed beside the clients the job already
    runs here (``job.run.plan``); in a dry run, a program that is not there (127, 126), which
    a real launch leaves to the nodes it runs on. Only what this host cannot know is left to
    the ranks (no NVML where the launch runs). The launcher itself runs here: one that is not
    there, or cannot run, is 127 or 126 before anything starts, dry run or not."""
    check_program([line.launcher], env)
    for segment in line.segments if opts.dry_run else ():
        if segment.program and line.family != TORCHRUN.family:  # torchrun's: a script
            check_program(segment.program, os.environ)
    per_node = launchargs.ranks_per_node(line, env)
    if per_node is None:
        return
    try:
        planned = plan(replace(opts, job=job), "launch")
        planned = planned.use(per_node, gpus=launchargs.gpus_per_node(line))
        for rank in range(per_node):
            planned.place(rank, per_node)
    except MpswrapError as exc:
        # The ranks get the same options and refuse them the same way; a GPU inventory file
        # is the nodes' own, as NVML is.
        if exc.exit_code == 2 and not isinstance(exc, InventoryFileError):
            raise
        log.debug("capacity not checked before launch: %s", exc.line())


def _run_launcher(argv: list[str], env: Mapping[str, str], settle: float) -> int:
    """Run the launcher in our process group and return its exit code (128+signal after
    TERM/INT/HUP).

    The terminal, ``kill -- -PGID`` and Slurm (every process of the step) signal the launcher
    directly. Forwarding those at once would deliver them twice, and twice means "abort now"
    to both launchers: mpirun then SIGKILLs every rank (mid terminate_client), srun kills the
    tasks on a second ^C. So TERM/INT/HUP are forwarded only if the launcher still runs
    ``settle`` seconds later (it may not have got it: ``kill <mpswrap pid>``), and killed
    with its processes if it still runs ``settle + 30`` s after that. USR1/USR2 go at once.
    """
    with SignalTrap() as trap:
        proc = _proc.spawn(argv, env=env, new_session=False, stdin=None, cwd=None)
        ident = _proc.identify(proc.pid) or _proc.ProcId(proc.pid, 0.0)
        launcher = Rank(proc, ident, None, argv[0])
        steps: list[tuple[float, int]] = []  # (when, signal) still to send to the launcher

        def schedule(sig: int) -> None:
            now = time.monotonic()
            steps[:] = [(now + settle, sig), (now + 2 * settle + 30, signal.SIGKILL)]

        def send_due() -> float:
            if steps and time.monotonic() >= steps[0][0]:
                sig = steps.pop(0)[1]
                log.warning(
                    "%s still running %g s after a signal: sending it signal %d",
                    argv[0],
                    settle,
                    sig,
                )
                if sig == signal.SIGKILL:  # the launcher and its processes
                    end_procs([], sig, children=[proc], tree=True)
                else:
                    _proc.kill_procs([ident], sig)
            return max(0.0, steps[0][0] - time.monotonic()) if steps else 1.0

        return watch([launcher], trap, grace=settle, on_terminate=schedule, tick=send_due)
