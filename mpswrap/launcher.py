"""``mpswrap [options] (LAUNCHER ... | run ... | [--] PROGRAM ...)``: the launcher front end.

The first word after the wrapper options picks the mode:

- prefix (``srun``, ``mpirun``, ``mpiexec``, ``orterun``): refuse what cannot fit before
  launching, then run the launcher with ``mpswrap -- `` inserted before each program
  (``launchargs``), forwarding signals to it, and return its exit code;
- ``run``: ``mpswrap run -n N -- cmd`` on this machine alone (``localrun``);
- anything else, or any word after ``--``: per-rank mode, one rank of ``srun mpswrap ./app``
  or ``mpirun -np 8 mpswrap ./app``: attach to the job's daemons (the prolog's, or start
  user-mode ones), pick this rank's GPU, and supervise the program (``supervisor``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import select
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from . import _proc, launchargs
from .client import provision_threads
from .config import Settings, load_settings
from .errors import GpuError, MpswrapError, UsageError
from .gpu import GpuInfo, load_inventory, resolve_gpus
from .jobenv import JobEnv
from .localrun import (
    RankOptions,
    check_gpus,
    gpus_of,
    place,
    planned_gpus,
    print_rank,
    rank_capacity,
    run_local,
)
from .owner import Attachment, attach, release, visible_gpus
from .supervisor import FORWARDED, TERMINATING, SignalTrap, exit_code, supervise

__all__ = ["cli"]

log = logging.getLogger(__name__)

#: Open MPI's odls_base_sigkill_timeout T (default 1 s): when mpirun aborts (a signal, a failed
#: rank) it SIGTERMs every rank's process group after T and SIGKILLs it, client included,
#: after 2T (seen with Open MPI 4.1). The ladder of a dozen ranks through one busy real daemon
#: needed more than 1 s on an H100; T also delays the SIGTERM, so it stays small.
OMPI_SIGKILL_TIMEOUT = "5"
_SIZE = re.compile(r"^[1-9][0-9]*[MG]$")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message, hint=f"{self.prog} --help")


#: (flags, argparse keywords) shared by every mode; ``run`` adds ``-n``.
# fmt: off
OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--gpus",), {"metavar": "LIST", "help": "GPUs to use: 'all', NVML indices or UUIDs"}),
    (("--policy",), {"choices": ("block", "cyclic", "affinity"), "help": "rank to GPU mapping"}),
    (("--threads",), {"metavar": "SPEC", "help": "active thread %%: none, uniform, "
                      "oversubscribe, a percent, or weights w1:w2:..."}),
    (("--mem-limit",), {"metavar": "SIZE", "help": "pinned device memory per client: "
                        "auto (GPU memory / ranks on it) or e.g. 8G, 512M"}),
    (("--priority",), {"type": int, "choices": (0, 1), "help": "client priority (1 = below)"}),
    (("--verify-attach",), {"choices": ("fail", "warn"),
                            "help": "check each rank became an MPS client"}),
    (("--verify-timeout",), {"type": float, "default": 30.0, "metavar": "S",
                             "help": "seconds to wait for attachment (default 30)"}),
    (("--no-shield",), {"action": "store_true",
                        "help": "let TERM/INT/HUP reach the program directly"}),
    (("--grace",), {"type": float, "metavar": "S",
                    "help": "seconds from signal to SIGKILL (default: kill_grace)"}),
    (("--dry-run",), {"action": "store_true", "help": "print what would run; start nothing"}),
    (("--job",), {"metavar": "ID", "help": "job id for the per-job state (default: Slurm's)"}),
    (("--debug",), {"action": "store_true", "help": "verbose logs and tracebacks"}),
)
RUN_OPTIONS = (
    *OPTIONS,
    (("-n", "--np"), {"type": int, "required": True, "dest": "nprocs", "help": "ranks to start"}),
)
# fmt: on


def build_parser(
    options: Sequence[tuple[tuple[str, ...], dict[str, Any]]] = OPTIONS, prog: str = "mpswrap"
) -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        allow_abbrev=False,
        usage=f"{prog} [options] (srun|mpirun|mpiexec|orterun) ... | {prog} [options] [--] "
        f"PROGRAM ... | {prog} run -n N [options] -- COMMAND ...",
    )
    for flags, kwargs in options:
        parser.add_argument(*flags, **kwargs)
    return parser


def _valued(options: Sequence[tuple[tuple[str, ...], dict[str, Any]]]) -> set[str]:
    return {f for flags, kw in options if kw.get("action") != "store_true" for f in flags}


def split_options(argv: Sequence[str], valued: set[str]) -> tuple[list[str], list[str], bool]:
    """(wrapper options, the rest, whether ``--`` ended them): options end at the first
    positional word or ``--``."""
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--":
            return list(argv[:index]), list(argv[index + 1 :]), True
        if not word.startswith("-") or word == "-":
            break
        index += 2 if word in valued else 1
    return list(argv[:index]), list(argv[index:]), False


def cli(argv: list[str]) -> int:
    """Entry point from ``mpswrap.cli.main``; MpswrapError propagates to it."""
    head, rest, dashdash = split_options(argv, _valued(OPTIONS))
    try:
        args = build_parser().parse_args(head)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    if args.debug or os.environ.get("MPSWRAP_DEBUG") == "1":
        logging.getLogger("mpswrap").setLevel(logging.DEBUG)
    _check_args(args)
    if not rest:
        raise UsageError("no program or launcher given", hint="mpswrap --help")
    if not dashdash and rest[0] == "run":
        return _local(args, rest[1:])
    if not dashdash and launchargs.family_of(rest[0]):
        return _prefix(args, rest)
    if not args.debug and os.environ.get("MPSWRAP_DEBUG") != "1":
        # "daemon already running" from every rank is noise at 48 ranks a GPU
        logging.getLogger("mpswrap").setLevel(logging.WARNING)
    return _per_rank(args, rest)


def _check_args(args: argparse.Namespace) -> None:
    if args.threads is not None:
        provision_threads(args.threads, 1, 0)  # raises UsageError naming the valid forms
    if args.mem_limit not in (None, "auto") and not _SIZE.match(args.mem_limit):
        raise UsageError("bad --mem-limit", thing=args.mem_limit, hint="use auto, 8G or 512M")
    if args.verify_timeout <= 0 or (args.grace is not None and args.grace < 0):
        raise UsageError("--verify-timeout and --grace must be positive")


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings({"gpu_policy": args.policy})


def _rank_options(args: argparse.Namespace, settings: Settings) -> RankOptions:
    return RankOptions(
        policy=settings.gpu_policy,
        threads=args.threads,
        mem_limit=args.mem_limit,
        priority=args.priority,
        verify_attach=args.verify_attach,
        verify_timeout=args.verify_timeout,
        shield=not args.no_shield,
        grace=settings.kill_grace if args.grace is None else args.grace,
    )


def _job_env(args: argparse.Namespace) -> JobEnv:
    """The job view for attach: ``--job`` names the per-job state when given."""
    env = dict(os.environ)
    if args.job:
        env["MPSWRAP_JOB"] = args.job
    return JobEnv(env)


def _chosen_gpus(args: argparse.Namespace, settings: Settings) -> list[GpuInfo] | None:
    if args.gpus is None:
        return None
    return resolve_gpus(args.gpus, load_inventory(settings.gpu_inventory))


# --- local mode ----------------------------------------------------------------------------
def _local(args: argparse.Namespace, argv: list[str]) -> int:
    head, command, _ = split_options(argv, _valued(RUN_OPTIONS))
    parser = build_parser(RUN_OPTIONS, prog="mpswrap run")
    try:
        run_args = parser.parse_args(head, namespace=args)
    except SystemExit as exc:
        return int(exc.code or 0)
    _check_args(run_args)
    settings = _settings(run_args)
    return run_local(
        command,
        run_args.nprocs,
        settings,
        _rank_options(run_args, settings),
        job=run_args.job,
        gpus=_chosen_gpus(run_args, settings),
        dry_run=run_args.dry_run,
    )


# --- per-rank mode -------------------------------------------------------------------------
def _local_position(env: JobEnv, policy: str) -> tuple[int, int, str]:
    """(local rank, local size, policy) by the innermost launcher's variables."""
    rank, size = env.local_rank, env.local_size
    if rank is None:
        return 0, max(size or 1, 1), policy
    if size is None or size <= rank:
        log.warning(
            "local rank %d but no usable local size (%s): placing ranks cyclically", rank, size
        )
        return rank, rank + 1, "cyclic"
    return rank, size, policy


def _pairs(att: Attachment, gpus: list[GpuInfo] | None) -> list[tuple[str, str]]:
    """The attachment's (key, UUID) pairs, restricted to ``--gpus`` for prolog daemons."""
    pairs = gpus_of(att)
    if gpus is None or att.mode == "user":
        return pairs
    wanted = {g.uuid for g in gpus}
    chosen = [p for p in pairs if p[1] in wanted]
    if not chosen:
        raise GpuError("--gpus names none of the job's MPS GPUs", thing=", ".join(wanted))
    return chosen


def _per_rank(args: argparse.Namespace, command: list[str]) -> int:
    settings = _settings(args)
    env = dict(os.environ)
    job_env = _job_env(args)
    opts = _rank_options(args, settings)
    rank, size, policy = _local_position(job_env, opts.policy)
    opts = dataclasses.replace(opts, policy=policy)
    gpus = _chosen_gpus(args, settings)
    if args.dry_run:
        layout, pairs = planned_gpus(settings, job_env, gpus)
        found = place(layout, pairs, settings, local_rank=rank, local_size=size, opts=opts)
        print_rank(rank, found, found.env, command)
        return 0
    # Signals are recorded, not acted on, until the child runs: attach/release must finish.
    with SignalTrap() as trap:
        att = attach(settings, job_env, gpus=gpus)
        try:
            rank_capacity(att, size, policy, env)
            found = place(
                att.layout, _pairs(att, gpus), settings, local_rank=rank, local_size=size, opts=opts
            )
            early = [s for s in trap.pop() if s in TERMINATING]
            if early:
                return 128 + early[0]
            return supervise(
                command,
                {**env, **found.env},
                daemon=found.daemon,
                grace=opts.grace,
                shield=opts.shield,
                verify_attach=opts.verify_attach,
                verify_timeout=opts.verify_timeout,
                name=f"rank {rank if job_env.rank is None else job_env.rank}",
                lock=found.lock,
            )
        finally:
            release(att)


# --- prefix mode ---------------------------------------------------------------------------
def _prefix(args: argparse.Namespace, argv: list[str]) -> int:
    line = launchargs.parse(argv)
    settings = _settings(args)
    env = dict(os.environ)
    exported = [v for s in line.segments for v in s.values("export")]
    if any(not v.startswith("ALL") for v in exported):  # srun passes only what it names
        log.warning("srun --export=%s: MPSWRAP_* settings reach the ranks only if named there",
                    exported[-1])  # fmt: skip
    _check_launch_capacity(line, args, settings, env)
    job = _launch_job(line, args, env)
    extra = _launch_env(line, env, job)
    env.update(extra)
    exports: list[str] = []
    if line.family == launchargs.OMPI:  # Open MPI gives remote ranks only what -x names
        for name in sorted(n for n in env if n.startswith("MPSWRAP_")):
            exports += ["-x", name]
    rewritten = line.argv(_rank_wrapper(args, job), exports)
    if args.dry_run:
        for name, value in sorted(extra.items()):
            print(f"{name}={shlex.quote(value)}")
        print(shlex.join(rewritten))
        return 0
    return _run_launcher(rewritten, env, _signal_bound(settings, args))


def _signal_bound(settings: Settings, args: argparse.Namespace) -> float:
    """How long the launcher may take to end its ranks after a signal: their ladders."""
    grace = settings.kill_grace if args.grace is None else args.grace
    return float(grace + settings.terminate_timeout + 5)


def _launch_job(
    line: launchargs.CommandLine, args: argparse.Namespace, env: Mapping[str, str]
) -> str | None:
    """The job id every rank of this launch uses, so local ranks share one layout."""
    job: str | None = args.job or env.get("MPSWRAP_JOB") or env.get("SLURM_JOB_ID")
    if job is None and line.family == launchargs.OMPI:
        job = f"mpirun-{os.getpid()}"  # outside Slurm: one fresh user-mode layout per run
    return job  # srun outside an allocation: its ranks get the new job's SLURM_JOB_ID


def _launch_env(
    line: launchargs.CommandLine, env: Mapping[str, str], job: str | None
) -> dict[str, str]:
    """Variables for the launcher and every rank (the job id also goes on the ranks' command
    line: argv survives ``srun --export=NONE``)."""
    extra: dict[str, str] = {"MPSWRAP_JOB": job} if job else {}
    mca = "odls_base_sigkill_timeout"
    given = any(v == mca for s in line.segments for v in s.values("mca"))
    if line.family == launchargs.OMPI and not given and f"OMPI_MCA_{mca}" not in env:
        extra[f"OMPI_MCA_{mca}"] = OMPI_SIGKILL_TIMEOUT
    return extra


def _rank_wrapper(args: argparse.Namespace, job: str | None) -> list[str]:
    """``python -m mpswrap --opt=value ... --``: the same interpreter on every node.

    One token per option: ``mpswrap.cli`` picks its mode from the first word that is not an
    option, and a value such as ``--job stop`` must not read as the ``stop`` command.
    """
    values = {"job": job, "verify_timeout": args.verify_timeout if args.verify_attach else None}
    for name in ("gpus", "policy", "threads", "mem_limit", "priority", "verify_attach", "grace"):
        values[name] = getattr(args, name)
    out = [sys.executable, "-m", "mpswrap"]
    out += [f"--{k.replace('_', '-')}={v}" for k, v in values.items() if v is not None]
    out += ["--no-shield"] if args.no_shield else []
    out += ["--debug"] if args.debug else []
    return [*out, "--"]


def _check_launch_capacity(
    line: launchargs.CommandLine,
    args: argparse.Namespace,
    settings: Settings,
    env: Mapping[str, str],
) -> None:
    """Refuse before launch when the command line alone shows a GPU would get too many."""
    per_node = launchargs.ranks_per_node(line, env)
    if per_node is None:
        return
    try:
        gpus = _chosen_gpus(args, settings) or visible_gpus(JobEnv(env), settings)
    except MpswrapError as exc:  # e.g. no NVML where the launch command runs
        log.debug("capacity not checked before launch: %s", exc.line())
        return
    gpus = gpus[: launchargs.gpus_per_node(line) or len(gpus)]
    check_gpus(gpus, per_node, settings, env, settings.gpu_policy)


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
        got: int | None = None
        steps: list[tuple[float, int]] = []  # (when, signal) still to send to the launcher
        while proc.poll() is None:
            for sig in trap.pop():
                if sig in FORWARDED:
                    _proc.kill_procs([ident], sig)
                elif got is None:
                    got, now = sig, time.monotonic()
                    steps = [(now + settle, sig), (now + 2 * settle + 30, signal.SIGKILL)]
            if steps and time.monotonic() >= steps[0][0]:
                sig = steps.pop(0)[1]
                log.warning("%s still running %g s after signal %d: sending it signal %d",
                            argv[0], settle, got, sig)  # fmt: skip
                tree = _proc.children_of(ident.pid) if sig == signal.SIGKILL else []
                _proc.kill_procs([ident, *tree], sig)
            select.select([trap.wake_fd], [], [], 0.05)
        return 128 + got if got is not None else exit_code(proc.returncode)
