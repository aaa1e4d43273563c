"""What Slurm says about a job beyond plain variables: opt-in triggers and task counts."""

from __future__ import annotations

import logging
import re

from . import _proc
from .control import SAFE_PATH
from .errors import ProcError
from .jobenv import JobEnv

__all__ = ["job_opted_in", "scontrol_job", "tasks_on_node"]

log = logging.getLogger(__name__)


def scontrol_job(env: JobEnv) -> dict[str, str]:
    """``scontrol show job -o <id>`` as a dict (bounded; empty on failure)."""
    if not env.job_id:
        return {}
    run_env = {"PATH": SAFE_PATH}
    if env.env.get("SLURM_CONF"):
        run_env["SLURM_CONF"] = env.env["SLURM_CONF"]
    try:
        res = _proc.run(["scontrol", "-o", "show", "job", env.job_id], env=run_env, timeout=10)
    except ProcError as exc:
        log.warning("cannot query the job: %s", exc.line())
        return {}
    fields: dict[str, str] = {}
    # Values may contain spaces (Comment=...); split only before "Key=" tokens.
    for match in re.finditer(r"(\w[\w:/]*)=(.*?)(?=\s+\w[\w:/]*=|$)", res.stdout.strip()):
        fields[match.group(1)] = match.group(2)
    return fields


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


def tasks_on_node(env: JobEnv) -> int | None:
    """Tasks of this step on this node, from ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``)."""
    spec = env.env.get("SLURM_STEP_TASKS_PER_NODE") or env.env.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return env.local_size
    counts: list[int] = []
    for part in spec.split(","):
        match = re.match(r"^(\d+)(?:\(x(\d+)\))?$", part.strip())
        if not match:
            return env.local_size
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    node_id = env.env.get("SLURM_NODEID", "0")
    index = int(node_id) if node_id.isdigit() else 0
    return counts[index] if index < len(counts) else counts[-1]
