"""Slurm hooks: prolog (root), task prolog (job user, per task) and epilog (root).

The prolog starts one daemon per allocated GPU of an opted-in job, as the job's user; the task
prolog prints the ``export`` lines that attach each task of a real step to its GPU's daemon;
the epilog runs the teardown ladder for this job only and proves nothing is left.

Each hook keeps the exit-code contract of slurm/README.md ("Exit codes"): the prolog fails
only under ``prolog_failure = drain`` when this job's MPS could not be set up; the task prolog
never fails a task; the epilog fails only under ``epilog_failure = drain`` when something of
this job survives. Every failure is one line; a traceback goes only to the debug log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Sequence

from .. import _proc, _wait
from ..config import DEFAULT_CONFIG_FILE, Settings, admin_file, load_settings
from ..errors import (
    ConfigError,
    LineFormatter,
    MpswrapError,
    TrustError,
    UsageError,
    internal_error,
    one_line,
    shown,
)
from ..job import state
from ..job.exclusive import make_exclusive, restore_modes
from ..job.job import JobDaemons
from ..job.launchers import daemon_names
from ..job.placement import place, provision_threads, slot_of
from ..jobenv import GpuRef, JobEnv
from ..mps.gpu import health_problem
from ..mps.start import Defaults
from ..slurm.gpus import default_gres_conf, resolve_slurm_gpus
from ..slurm.scontrol import (
    NodeShare,
    gpu_percentages,
    holds_part_of_node,
    is_launcher_daemon_step,
    job_opted_in,
    node_share,
    os_cpus,
    scontrol,
)

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["HOOKS", "cli", "epilog", "prolog", "run_hook", "task_prolog"]

log = logging.getLogger(__name__)

#: Where an unexpected error's traceback goes: the hooks' log, at this level only.
TRACEBACK_AT = "at log_level = debug"
Problems = Sequence[ConfigError]
#: The characters install.sh allows in the paths it puts into the shims.
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9/._+-]*")


def _job_formatter(hook: str, env: JobEnv) -> LineFormatter:
    """``mpswrap: <hook>: job J node N: <one line>``; a traceback only on a debug record."""
    try:
        job = f" job {env.slurm_job()}"
    except MpswrapError:  # a message says what is wrong with it
        job = ""
    return LineFormatter(f"mpswrap: {hook}:{job} node {_shown(env.node)}")


def _shown(text: str) -> str:
    """Slurm's text as a log prefix may show it: printable, short, else quoted."""
    return shown(text, 64, spaces=False)


def _setup_logging(hook: str, env: JobEnv, settings: Settings | None) -> None:
    """Every line names the hook, job and node; GPUs are named by the messages themselves.
    The task prolog logs to stderr alone: syslog would get a line per task."""
    root = logging.getLogger("mpswrap")
    root.handlers.clear()
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(_job_formatter(hook, env))
    root.addHandler(stderr)
    wants_syslog = settings is not None and settings.syslog and hook != "task-prolog"
    if wants_syslog and os.path.exists("/dev/log"):
        from logging.handlers import SysLogHandler  # only here: it loads socket and pickle

        try:
            sys_handler = SysLogHandler(address="/dev/log")
            sys_handler.setFormatter(_job_formatter(hook, env))
            root.addHandler(sys_handler)
        except OSError:
            pass
    level = settings.log_level if settings else "info"
    root.setLevel(getattr(logging, level.upper()))
    root.propagate = False


# --- prolog --------------------------------------------------------------------------
def prolog(env: JobEnv, settings: Settings, problems: Problems = ()) -> int:
    """Start the job's daemons; 1 only under prolog_failure = drain, when that failed."""
    try:
        for problem in problems:  # root read none of an admin file others can change
            if isinstance(problem, TrustError):
                raise problem  # every job: its settings (prolog_mode too) are unknown
        if not _wants_mps(env, settings):
            return 0
        if problems:  # a broken admin file matters from here on: this job wants MPS
            raise problems[0]
        _start_job(env, settings, env.job_gpus or ())
    except MpswrapError as exc:
        _undo_exclusive(env, settings)
        return _prolog_failed(env, settings, exc.line())
    return 0


def _undo_exclusive(env: JobEnv, settings: Settings) -> None:
    """A prolog that failed gives back the compute mode it set (exclusive_process): the job
    runs without MPS, and EXCLUSIVE_PROCESS would allow one of its processes alone."""
    if settings.exclusive_process:
        with contextlib.suppress(MpswrapError, OSError):
            restore_modes(env, settings, env.slurm_job())


def _wants_mps(env: JobEnv, settings: Settings) -> bool:
    if settings.prolog_mode == "never" or not env.job_gpus_text:
        return False
    if settings.prolog_mode == "opt-in" and not job_opted_in(env, settings.opt_in):
        log.debug("job did not opt in to MPS")
        return False
    return True


def _prolog_failed(env: JobEnv, settings: Settings | None, line: str) -> int:
    """Log why this job's MPS could not be set up; drain with that line, if so configured."""
    log.error("%s", line)  # the log prefix already says "prolog: job J node N"
    if settings is not None and settings.prolog_failure == "drain":
        _drain(env, f"mpswrap prolog: {line}"[:400])
        return 1
    log.warning("continuing without MPS (prolog_failure = continue)")
    return 0


def _start_job(env: JobEnv, settings: Settings, refs: Sequence[GpuRef]) -> None:
    job, user = env.slurm_job(), _job_user(env)
    if user.uid == 0:
        log.warning(
            "a job of uid 0 gets no MPS: its daemon would run as root (the job runs without MPS)"
        )
        return
    inventory = state.node_inventory(settings, env.node)
    found = resolve_slurm_gpus(refs, inventory, default_gres_conf(env.env), env.node)
    # The job's line of `scontrol show job -d`: its CPUs here, its per-GPU gres/mps counts.
    several = len(found) > 1 and env.mps_job_percentage is not None
    part = settings.cpu_binding and holds_part_of_node(env)
    share = node_share(env) if part or several or settings.exclusive_process else None
    base = Defaults.from_settings(settings, task_threads=_task_threads(env))
    percentages = gpu_percentages(env, share, [position for position, _ in found])
    if settings.exclusive_process:  # the last step before the daemons: every input checked
        make_exclusive(env, settings, share, [gpu for _, gpu in found])
    manifests = JobDaemons(state.admin_layout(settings, env.node, job), settings).start(
        [gpu for _, gpu in found],
        user,
        started_by="prolog",
        defaults=[base.with_percentage(p) for p in percentages],
        shared_parents=True,
        keys=[f"g{position}" for position, _ in found],
        allowed_cpus=_job_cpus(share),
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


def _job_cpus(share: NodeShare | None) -> frozenset[int] | None:
    """The OS ids of the job's CPUs on this node (each daemon runs on its GPU's CPUs among
    them); None, and the GPU's CPUs alone, when Slurm did not say or none of them is here."""
    if share is None:
        return None
    cpus = os_cpus(share.cpu_ids)
    if not cpus:
        log.warning("the job's CPU_IDs %s are not CPUs of this machine", share.cpu_ids)
    return cpus or None


def _task_threads(env: JobEnv) -> str | None:
    """The ``--threads`` policy of ``--mps=POLICY`` (the SPANK plugin checked it at submission;
    one it did not check is set aside with a warning, never a reason to fail the job)."""
    policy = env.mps_request
    if policy in (None, "", "default"):
        return None
    try:
        provision_threads(policy, 1, 0)
    except UsageError as exc:
        log.warning("--mps=%s: %s; the tasks get no thread limit", policy, exc.line())
        return None
    return policy


def _job_user(env: JobEnv) -> _proc.UserIds:
    """The job's user by uid; a user name beside it must name the same user."""
    uid = env.job_uid
    if uid is None:
        raise MpswrapError("SLURM_JOB_UID is not set")
    user = _proc.lookup_user(uid, gid=env.job_gid)
    if env.job_user is not None and env.job_user != user.name:
        raise MpswrapError(
            "SLURM_JOB_USER and SLURM_JOB_UID disagree",
            thing=f"{env.job_user!r}, uid {uid} is {user.name!r}",
        )
    return user


def _drain(env: JobEnv, reason: str) -> None:
    """Name the cause in the node's drain reason; Slurm drains it anyway when we exit 1."""
    argv = ["update", f"NodeName={env.node}", "State=DRAIN", f"Reason={reason}"]
    try:
        res = scontrol(env, argv)
    except MpswrapError as exc:
        problem = exc.line()
    else:
        if res.returncode == 0:
            return
        problem = f"scontrol exited {res.returncode}: {one_line(res.stderr)[-200:]}"
    log.warning("could not set the drain reason %r: %s", reason, problem)


# --- task prolog ----------------------------------------------------------------------
def task_prolog(env: JobEnv, settings: Settings, problems: Problems = ()) -> int:
    """Print ``export`` lines for a task of a real step of a job that has daemons; on any
    error only the admin file's, and one line on stderr: the task then runs as Slurm set it
    up. Every task (the batch step's too) learns where the admin file is when it is not at
    the default path, so that ``mpswrap status`` and user mode in the job read the admin's
    settings."""
    exports = _config_export(env)
    try:
        exports.update(_task_exports(env, settings, problems))
    except MpswrapError as exc:
        log.error("%s", exc.line())
    for name, value in exports.items():
        print(f"export {name}={value}")
    return 0


def _config_export(env: JobEnv) -> dict[str, str]:
    """``MPSWRAP_CONFIG`` for the task, where the admin file is not at the default path. The
    path is root's: the shim (installed by root) sets it, in an environment it cleared of the
    job user's variables. A line break in it would make a second line for slurmstepd."""
    path = admin_file(env.env)
    if path == DEFAULT_CONFIG_FILE:
        return {}
    if not _PLAIN_PATH.fullmatch(path):
        log.warning("not passing the admin file's path %r to the task: not a plain path", path)
        return {}
    return {"MPSWRAP_CONFIG": path}


def _task_exports(env: JobEnv, settings: Settings, problems: Problems) -> dict[str, str]:
    if not env.is_real_step or env.job_id is None:
        return {}  # the batch/extern step: its children (e.g. mpirun ranks) must not share a GPU
    if problems:
        raise problems[0]
    daemons = JobDaemons(state.admin_layout(settings, env.node, env.slurm_job()), settings)
    manifests = daemons.manifests()
    slots = daemons.slots(None, manifests)  # no NVML here: once per task
    refs = env.step_gpus
    if not slots or not refs or is_launcher_daemon_step(env, daemon_names()):
        return {}
    if (env.gpus_per_task or 1) > 1:  # one task on several GPUs: no one daemon serves them
        log.warning(
            "a task of %d GPUs runs without MPS: the job's daemons serve one GPU each (run it "
            "as mpswrap --gpus-per-rank %d ./app for one daemon over its GPUs)",
            env.gpus_per_task,
            env.gpus_per_task,
        )
        return {}
    mine = [slot_of(ref, slots) for ref in refs]
    if None in mine:
        return {}  # a step GPU without a daemon: leave the task as Slurm set it
    size = env.local_size or 1
    policy = "cyclic" if settings.gpu_policy == "cyclic" else "block"
    # The job's --mps=POLICY, as the prolog recorded it (the same on every GPU of the job).
    threads = next((m.settings.get("task_threads") for m in manifests), None)
    local = min(env.local_rank or 0, size - 1)
    found = place([s for s in mine if s], local, size, policy=policy, threads=threads)
    return dict(found.env)


# --- epilog ---------------------------------------------------------------------------
def epilog(env: JobEnv, settings: Settings, problems: Problems = ()) -> int:
    """The ladder for the prolog's daemons and every user-mode one of the job's user; 1 only
    under epilog_failure = drain, when something of this job survives."""
    for problem in problems:  # tear down with what could be read: the defaults for the rest
        used = "the defaults are used" if isinstance(problem, TrustError) else "its default is used"
        log.warning("%s (%s)", problem.line(), used)
    try:
        job = env.slurm_job()
    except MpswrapError as exc:  # then the prolog started nothing under it either
        log.warning("%s: nothing of a job to tear down", exc.line())
        return 0
    left, uuids = _teardown(env, settings, job)
    left += restore_modes(env, settings, job)  # exclusive_process: the mode found
    if settings.health_check:
        left += _health_check(uuids, settings)
    if left and settings.epilog_failure == "drain":
        return 1
    return 0


def _teardown(env: JobEnv, settings: Settings, job: str) -> tuple[int, list[str]]:
    """Stop every layout of the job within one deadline (``teardown_deadline``); (how many
    of its processes survive, the GPUs root started daemons on). Files left (a tree refused,
    a directory the job's user keeps) and what a user-mode tree's own teardown reports are
    named, never counted: only what root started for this job and still runs may drain the
    node."""
    left, uuids, uid = 0, [], _epilog_uid(env)
    deadline = _wait.Deadline(settings.teardown_deadline)
    for layout in state.job_layouts(settings, env.node, job, uid):
        daemons = JobDaemons(layout, settings)
        uuids += daemons.uuids()
        try:
            done = daemons.stop(deadline=deadline)
        except MpswrapError as exc:  # e.g. a lock held elsewhere: the job's state stays
            log.error("left behind after teardown: %s (%s)", layout.job_dir, exc.line())
            left += 1
            continue
        for line in done.summary():
            log.info("%s", line)
        for item in done.files():
            log.warning("left behind after teardown (nothing of the job runs there): %s", item)
        for item in done.survivors():
            log.error("left behind after teardown: %s", item)
        left += len(done.survivors())
    if deadline.passed:
        log.warning(
            "the teardown took its whole deadline (teardown_deadline = %g s)",
            settings.teardown_deadline,
        )
    return left, uuids


def _epilog_uid(env: JobEnv) -> int:
    """The job's uid, for its user-mode daemons; -1 (the admin layout alone) if unknown or
    root's (root's own user-mode trees are no job's)."""
    try:
        uid = env.job_uid
    except ConfigError as exc:
        log.warning("%s: only the prolog's daemons are looked for", exc.line())
        return -1
    return -1 if uid is None or uid == 0 else uid


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


def cli(args: Any) -> int:
    """The hook ``args.command`` (``--config`` where given), from the command table."""
    return run_hook(args.command, getattr(args, "config", None))


def run_hook(hook: str, config_file: str | None = None) -> int:
    """Run one hook as slurmd calls it; the exit code keeps the hook's contract."""
    env, settings = JobEnv.current(), None
    if config_file:  # run by hand with --config: as the shim names it, in the environment
        env = JobEnv({**env.env, "MPSWRAP_CONFIG": config_file})
    problems: list[ConfigError] = []
    try:
        settings = load_settings(config_file=config_file, problems=problems)
        _setup_logging(hook, env, settings)
        return HOOKS[hook](env, settings, problems)
    except Exception as exc:  # the contract holds for the unexpected too
        return _failed(hook, env, settings, exc)


def _failed(hook: str, env: JobEnv, settings: Settings | None, exc: Exception) -> int:
    """A failure no hook handled: one line (an unexpected one's traceback at debug only),
    and the exit code the hook's contract gives a failure of unknown extent."""
    if settings is None:
        _setup_logging(hook, env, None)
    if isinstance(exc, MpswrapError):
        line = exc.line()
    else:
        line = internal_error(exc, TRACEBACK_AT)
        log.debug("%s", line, exc_info=exc)
    if hook == "prolog":
        if settings is not None:
            _undo_exclusive(env, settings)
        return _prolog_failed(env, settings, line)
    log.error("%s", line)
    # The epilog may have stopped halfway: something of the job may survive.
    return int(hook == "epilog" and (settings is None or settings.epilog_failure == "drain"))
