"""Slurm hooks: prolog (root), task prolog (job user, per task) and epilog (root).

The prolog starts one daemon per allocated GPU of an opted-in job, as the job's user; the task
prolog prints the ``export`` lines that attach each task of a real step to its GPU's daemon;
the epilog runs the teardown ladder for this job only and proves nothing is left.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import stat
import sys
from pathlib import Path

from . import _proc
from .client import choose_gpu
from .config import Settings, load_settings
from .control import SAFE_PATH
from .daemon import Defaults
from .errors import MpswrapError
from .gpu import default_gres_conf, health_problem, load_inventory, resolve_gres_positions
from .jobenv import JobEnv
from .node import JobDaemons
from .paths import JobLayout
from .slurmjob import is_launcher_daemon_step, job_opted_in, tasks_on_node

__all__ = ["cli", "epilog", "prolog", "task_prolog"]

log = logging.getLogger(__name__)


class _JobFormatter(logging.Formatter):
    def __init__(self, hook: str, env: JobEnv) -> None:
        super().__init__()
        self.prefix = f"mpswrap: {hook}: job {env.job_id} node {env.node}"

    def format(self, record: logging.LogRecord) -> str:
        return f"{self.prefix}: {record.getMessage()}"


def _setup_logging(hook: str, env: JobEnv, settings: Settings) -> None:
    """Every line names the hook, job and node; GPUs are named by the messages themselves."""
    root = logging.getLogger("mpswrap")
    root.handlers.clear()
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(_JobFormatter(hook, env))
    root.addHandler(stderr)
    if settings.syslog and os.path.exists("/dev/log"):
        try:
            sys_handler = logging.handlers.SysLogHandler(address="/dev/log")
            sys_handler.setFormatter(_JobFormatter(hook, env))
            root.addHandler(sys_handler)
        except OSError:
            pass
    root.setLevel(getattr(logging, settings.log_level.upper()))
    root.propagate = False


def _layout(settings: Settings, env: JobEnv) -> JobLayout:
    if env.job_id is None:
        raise MpswrapError(
            "SLURM_JOB_ID is not set",
            context="hook",
            hint="the hooks run from slurmd; use mpswrap start by hand",
        )
    return JobLayout(Path(settings.run_dir), env.node, env.job_id)


# --- prolog --------------------------------------------------------------------------
def prolog(env: JobEnv, settings: Settings) -> int:
    positions = env.job_gpus
    if settings.prolog_mode == "never" or not positions:
        return 0
    if settings.prolog_mode == "opt-in" and not job_opted_in(env, settings.opt_in):
        log.debug("job did not opt in to MPS")
        return 0
    try:
        _start_job(env, settings, positions)
    except MpswrapError as exc:
        log.error("%s", exc.line())  # the log prefix already says "prolog: job J node N"
        if settings.prolog_failure == "drain":
            _drain(env, f"mpswrap {exc.line()}"[:400])
            return 1
        log.warning("continuing without MPS (prolog_failure = continue)")
    return 0


def _start_job(env: JobEnv, settings: Settings, positions: tuple[int, ...]) -> None:
    inventory = load_inventory(settings.gpu_inventory)
    gpus = resolve_gres_positions(positions, inventory, default_gres_conf(env.env), env.node)
    if env.job_uid is None:
        raise MpswrapError("SLURM_JOB_UID is not set")
    user = _proc.lookup_user(env.job_uid, gid=env.job_gid)
    defaults = Defaults.from_settings(settings, active_thread_percentage=env.mps_percentage)
    manifests = JobDaemons(_layout(settings, env), settings).start(
        gpus,
        user,
        started_by="prolog",
        defaults=defaults,
        shared_parents=True,
        keys=[f"g{p}" for p in positions],
    )
    for m in manifests:
        log.info(
            "GPU %s (%s): MPS daemon %d as %s, cpus %s, settings %s",
            m.gpu_uuid,
            m.key,
            m.daemon_pid,
            m.user,
            ",".join(map(str, m.cpus)) or "all",
            m.settings or "-",
        )


def _drain(env: JobEnv, reason: str) -> None:
    """Name the cause in the node's drain reason; Slurm drains it anyway when we exit 1."""
    argv = ["scontrol", "update", f"NodeName={env.node}", "State=DRAIN", f"Reason={reason}"]
    try:
        _proc.run(argv, env={"PATH": SAFE_PATH, **_slurm_conf(env)}, timeout=10)
    except MpswrapError as exc:
        log.warning("could not set the drain reason: %s", exc.line())


def _slurm_conf(env: JobEnv) -> dict[str, str]:
    conf = env.env.get("SLURM_CONF")
    return {"SLURM_CONF": conf} if conf else {}


# --- task prolog ----------------------------------------------------------------------
def task_prolog(env: JobEnv, settings: Settings) -> int:
    """Print ``export`` lines for a task of a real step of a job that has daemons."""
    if not env.is_real_step or env.job_id is None:
        return 0  # the batch/extern step: its children (e.g. mpirun ranks) must not share a GPU
    daemons = JobDaemons(_layout(settings, env), settings)
    manifests = {m.key: m for m in daemons.manifests()}
    positions = env.step_gpus
    if not manifests or not positions or is_launcher_daemon_step(env):
        return 0
    local_rank = env.local_rank or 0
    local_size = tasks_on_node(env) or 1
    position = positions[
        choose_gpu(
            min(local_rank, local_size - 1),
            local_size,
            len(positions),
            policy="cyclic" if settings.gpu_policy == "cyclic" else "block",
        )
    ]
    manifest = manifests.get(f"g{position}")
    if manifest is None:
        return 0
    dirs = daemons.layout.gpu(manifest.key)
    print(f"export CUDA_MPS_PIPE_DIRECTORY={dirs.pipe}")
    print(f"export CUDA_MPS_LOG_DIRECTORY={dirs.log}")
    print(f"export CUDA_VISIBLE_DEVICES={manifest.gpu_uuid}")
    return 0


# --- epilog ---------------------------------------------------------------------------
def _job_layouts(settings: Settings, env: JobEnv) -> list[JobLayout]:
    """The prolog's layout and every user-mode layout the job's user may have used."""
    admin = _layout(settings, env)
    layouts = [admin]
    uid = env.job_uid
    if uid is not None:
        roots = {Path(f"/tmp/mpswrap-{uid}"), Path(f"/run/user/{uid}/mpswrap")}
        if settings.user_run_dir:
            roots.add(Path(settings.user_run_dir))
        users = [JobLayout(r, admin.node, admin.job_id) for r in sorted(roots)]
        layouts += [lay for lay in users if _owned_dirs(lay, uid)]
    return [lay for lay in layouts if lay.job_dir.exists()]


def _owned_dirs(layout: JobLayout, uid: int) -> bool:
    """A user-mode layout is the job user's: real directories (no symlink) owned by uid."""
    for path in (layout.run_dir, layout.node_dir, layout.job_dir):
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            return False
    return True


def epilog(env: JobEnv, settings: Settings) -> int:
    leftovers = 0
    uuids: list[str] = []
    for layout in _job_layouts(settings, env):
        daemons = JobDaemons(layout, settings)
        try:
            uuids += [m.gpu_uuid for m in daemons.manifests()]
        except MpswrapError as exc:  # a torn or forged manifest must not stop the teardown
            log.warning("%s", exc.line())
        for report in daemons.stop():
            log.info(
                "%s: terminated %d client(s), killed %d%s",
                report.key,
                len(report.terminated),
                len(report.killed),
                f" ({'; '.join(report.notes)})" if report.notes else "",
            )
            for item in report.leftovers:
                log.error("%s: left behind after teardown: %s", report.key, item)
            leftovers += len(report.leftovers)
        if layout.job_dir.exists():
            log.error("job directory left behind: %s", layout.job_dir)
            leftovers += 1
    if settings.health_check:
        leftovers += _health_check(uuids, settings)
    if leftovers and settings.epilog_failure == "drain":
        return 1
    return 0


def _health_check(uuids: list[str], settings: Settings) -> int:
    problems = 0
    for uuid in sorted(set(uuids)):
        problem = health_problem(uuid, settings.gpu_inventory)
        if problem:
            log.error("GPU %s failed the health check: %s", uuid, problem)
            problems += 1
        else:
            log.info("GPU %s passed the health check", uuid)
    return problems


HOOKS = {"prolog": prolog, "task-prolog": task_prolog, "epilog": epilog}


def cli(args: argparse.Namespace) -> int:
    env = JobEnv.current()
    settings = load_settings(config_file=args.config)
    if args.command != "task-prolog":
        _setup_logging(args.command, env, settings)
    try:
        return HOOKS[args.command](env, settings)
    except Exception as exc:
        if isinstance(exc, MpswrapError):
            print(exc.with_context(args.command).render(), file=sys.stderr)
        else:
            log.exception("unexpected error")
        return _failure_code(args.command, settings)


def _failure_code(hook: str, settings: Settings) -> int:
    """Exit code for an unexpected failure: only the admin's policy may drain a node.

    The task prolog never fails a task: without exports the task runs without MPS.
    """
    if hook == "prolog":
        return 1 if settings.prolog_failure == "drain" else 0
    if hook == "epilog":
        return 1 if settings.epilog_failure == "drain" else 0
    return 0
