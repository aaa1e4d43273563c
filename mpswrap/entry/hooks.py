"""Slurm hooks: prolog (root), task prolog (job user, per task) and epilog (root).

The prolog starts one daemon per allocated GPU of an opted-in job, as the job's user; the task
prolog prints the ``export`` lines that attach each task of a real step to its GPU's daemon;
the epilog runs the teardown ladder for this job only and proves nothing is left.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys

from .. import _proc
from ..config import Settings, load_settings
from ..errors import MpswrapError
from ..job import state
from ..job.job import JobDaemons
from ..job.placement import place
from ..jobenv import JobEnv
from ..mps.daemon import Defaults
from ..mps.gpu import default_gres_conf, health_problem, load_inventory, resolve_gres_positions
from .slurmjob import is_launcher_daemon_step, job_opted_in

__all__ = ["HOOKS", "epilog", "prolog", "run_hook", "task_prolog"]

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


def _job(env: JobEnv) -> str:
    """The hooks act on Slurm's job id alone (the shims pass no other variable)."""
    job = env.job_id
    if job is None:
        raise MpswrapError(
            "SLURM_JOB_ID is not set",
            context="hook",
            hint="the hooks run from slurmd; use mpswrap start by hand",
        )
    return job


def _daemons(settings: Settings, env: JobEnv) -> JobDaemons:
    return JobDaemons(state.admin_layout(settings, env.node, _job(env)), settings)


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
    manifests = _daemons(settings, env).start(
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
        _proc.run(argv, env={"PATH": _proc.SAFE_PATH, **_slurm_conf(env)}, timeout=10)
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
    daemons = _daemons(settings, env)
    by_key = {s.key: s for s in daemons.slots(None)}  # no NVML here: once per task
    positions = env.step_gpus
    if not by_key or not positions or is_launcher_daemon_step(env):
        return 0
    slots = [by_key[f"g{p}"] for p in positions if f"g{p}" in by_key]
    if len(slots) != len(positions):
        return 0  # a step GPU without a daemon: leave the task as Slurm set it
    size = env.local_size or 1
    policy = "cyclic" if settings.gpu_policy == "cyclic" else "block"
    found = place(slots, min(env.local_rank or 0, size - 1), size, policy=policy)
    for name, value in found.env.items():
        print(f"export {name}={value}")
    return 0


# --- epilog ---------------------------------------------------------------------------
def epilog(env: JobEnv, settings: Settings) -> int:
    """The ladder for the prolog's daemons and every user-mode one of the job's user."""
    job, problems, uuids = _job(env), 0, []
    uid = env.job_uid if env.job_uid is not None else -1  # no uid: the admin layout alone
    for layout in state.job_layouts(settings, env.node, job, uid):
        daemons = JobDaemons(layout, settings)
        try:
            uuids += [m.gpu_uuid for m in daemons.manifests()]
        except MpswrapError as exc:  # a torn or forged manifest must not stop the teardown
            log.warning("%s", exc.line())
        done = daemons.stop()
        for line in done.summary():
            log.info("%s", line)
        for item in done.problems():
            log.error("left behind after teardown: %s", item)
        problems += len(done.problems())
    if settings.health_check:
        problems += _health_check(uuids, settings)
    if problems and settings.epilog_failure == "drain":
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


def run_hook(hook: str, config_file: str | None = None) -> int:
    """Run one hook as slurmd calls it; the exit code follows the admin's failure policy."""
    env = JobEnv.current()
    settings = load_settings(config_file=config_file)
    if hook != "task-prolog":
        _setup_logging(hook, env, settings)
    try:
        return HOOKS[hook](env, settings)
    except Exception as exc:
        if isinstance(exc, MpswrapError):
            print(exc.with_context(hook).render(), file=sys.stderr)
        else:
            log.exception("unexpected error")
        return _failure_code(hook, settings)


def _failure_code(hook: str, settings: Settings) -> int:
    """Exit code for an unexpected failure: only the admin's policy may drain a node.

    The task prolog never fails a task: without exports the task runs without MPS.
    """
    if hook == "prolog":
        return 1 if settings.prolog_failure == "drain" else 0
    if hook == "epilog":
        return 1 if settings.epilog_failure == "drain" else 0
    return 0
