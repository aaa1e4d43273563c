"""What Slurm says about a job beyond plain variables: opt-in triggers and task counts."""

from __future__ import annotations

import logging
import re

from .. import _proc
from ..errors import MpswrapError, ProcError
from ..jobenv import JobEnv

__all__ = ["is_launcher_daemon_step", "job_opted_in", "scontrol_job"]

#: Daemons that MPI launchers start with srun, one per node: their children are the ranks,
#: which must not all inherit one GPU (Open MPI 4 orted, PRRTE prted, MPICH hydra).
LAUNCHER_DAEMONS = ("orted", "prted", "hydra_pmi_proxy", "hydra_bstrap_proxy")

log = logging.getLogger(__name__)


def _scontrol(env: JobEnv, what: str, ident: str) -> dict[str, str]:
    """``scontrol -o show <what> <id>`` as a dict (bounded; empty on failure)."""
    run_env = {"PATH": _proc.SAFE_PATH}
    if env.env.get("SLURM_CONF"):
        run_env["SLURM_CONF"] = env.env["SLURM_CONF"]
    try:
        res = _proc.run(["scontrol", "-o", "show", what, ident], env=run_env, timeout=10)
    except ProcError as exc:
        log.warning("cannot query the %s: %s", what, exc.line())
        return {}
    fields: dict[str, str] = {}
    # Values may contain spaces (Comment=...); split only before "Key=" tokens.
    for match in re.finditer(r"(\w[\w:/]*)=(.*?)(?=\s+\w[\w:/]*=|$)", res.stdout.strip()):
        fields[match.group(1)] = match.group(2)
    return fields


def _job_id(env: JobEnv) -> str | None:
    """Slurm's job id if it passes the hooks' check: nothing else reaches scontrol's argv."""
    try:
        return env.slurm_job()
    except MpswrapError:
        return None


def scontrol_job(env: JobEnv) -> dict[str, str]:
    job = _job_id(env)
    return _scontrol(env, "job", job) if job else {}


def is_launcher_daemon_step(env: JobEnv) -> bool:
    """True for a step that runs an MPI launcher's per-node daemon (e.g. mpirun's orted).

    Its environment looks like any other step's; only the step's name tells (Slurm names a
    step after its program). One bounded scontrol call, made only for jobs with daemons.
    """
    job = _job_id(env)
    if job is None or not env.is_real_step:
        return False
    step = _scontrol(env, "step", f"{job}.{env.step_id}")
    return step.get("Name", "").rsplit("/", 1)[-1] in LAUNCHER_DAEMONS


def _words(text: str) -> set[str]:
    return {w for w in re.split(r"[\s,&|*\[\]()]+", text) if w}


def job_opted_in(env: JobEnv, triggers: tuple[str, ...]) -> bool:
    """True if any trigger matches: ``gres-mps``, ``feature:<name>``, ``comment:<word>``."""
    if "gres-mps" in triggers and env.mps_percentage is not None:
        return True
    wanted_features = {t.split(":", 1)[1] for t in triggers if t.startswith("feature:")}
    wanted_comment = {t.split(":", 1)[1] for t in triggers if t.startswith("comment:")}
    if not wanted_features and not wanted_comment:
        return False
    features = env.env.get("SLURM_JOB_CONSTRAINTS")
    comment = env.env.get("SLURM_JOB_COMMENT")
    if features is None or comment is None:
        # slurmd's prolog gets neither variable on 22.05: ask slurmctld (one bounded call).
        job = scontrol_job(env)
        features = features if features is not None else job.get("Features", "")
        comment = comment if comment is not None else job.get("Comment", "")
    if wanted_features & _words(features):
        return True
    return bool(wanted_comment & _words(comment))
