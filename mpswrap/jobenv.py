"""A typed, read-only view of the Slurm / MPI / launcher environment.

Built from a mapping so tests pass a dict. The local rank follows the innermost-launcher rule:
an ``mpirun`` inside a batch job inherits ``SLURM_LOCALID=0`` for every rank, so the MPI
launchers' variables win over Slurm's.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError

__all__ = ["JobEnv", "parse_int_list"]

#: Innermost launcher first: MPI launchers, then Slurm, then torchrun-style LOCAL_RANK.
LOCAL_RANK_VARS = (
    "MPSWRAP_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "PMI_LOCAL_RANK",
    "PALS_LOCAL_RANKID",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "FLUX_TASK_LOCAL_ID",
    "SLURM_LOCALID",
    "LOCAL_RANK",
)
LOCAL_SIZE_VARS = (
    "MPSWRAP_LOCAL_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "PMI_LOCAL_SIZE",
    "PALS_LOCAL_SIZE",
    "MV2_COMM_WORLD_LOCAL_SIZE",
    "LOCAL_WORLD_SIZE",
)
RANK_VARS = (
    "MPSWRAP_RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "PALS_RANKID",
    "MV2_COMM_WORLD_RANK",
    "FLUX_TASK_RANK",
    "SLURM_PROCID",
    "RANK",
)


def tasks_per_node(spec: str, node_id: int) -> int | None:
    """This node's count from Slurm's ``2(x3),1`` style lists (None if malformed)."""
    counts: list[int] = []
    for part in spec.split(","):
        head, _, rest = part.strip().partition("(x")
        if not head.isdigit() or (rest and not rest.rstrip(")").isdigit()):
            return None
        counts += [int(head)] * int(rest.rstrip(")") or 1)
    if not counts:
        return None
    return counts[node_id] if node_id < len(counts) else counts[-1]


def parse_int_list(text: str, what: str = "list") -> tuple[int, ...]:
    """Parse ``0,2-3`` style lists (Slurm GPU and CPU lists)."""
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise ConfigError(
                f"malformed {what}", thing=repr(text), cause="expected numbers like 0,2-3"
            ) from None
        if first < 0 or last < first or last - first > 4096:
            raise ConfigError(f"malformed {what}", thing=repr(text), cause=f"bad range {part!r}")
        out.extend(range(first, last + 1))
    return tuple(out)


@dataclass(frozen=True)
class JobEnv:
    """What the environment says about the job, step, task and launcher."""

    env: Mapping[str, str]

    @classmethod
    def current(cls) -> JobEnv:
        return cls(dict(os.environ))

    def _get(self, name: str) -> str | None:
        value = self.env.get(name)
        return value if value not in (None, "") else None

    def _first_int(self, names: tuple[str, ...]) -> tuple[int | None, str | None]:
        for name in names:
            value = self._get(name)
            if value is None:
                continue
            try:
                return int(value), name
            except ValueError:
                raise ConfigError(
                    f"malformed {name}", thing=repr(value), cause="expected a whole number"
                ) from None
        return None, None

    # --- job -------------------------------------------------------------------------
    @property
    def job_id(self) -> str | None:
        return self._get("SLURM_JOB_ID") or self._get("SLURM_JOBID")

    def job_key(self, given: str | None = None, fresh: str | None = None) -> str | None:
        """THE job id mpswrap keeps a job's state under, the same for every rank of a node.

        In order: ``given`` (``--job``), ``MPSWRAP_JOB`` (set by the launcher for its ranks),
        Slurm's job id, the PMIx namespace (ranks of one ``mpirun``), then ``fresh`` (what the
        caller names a job of its own, e.g. ``run-<pid>``; None: no job is known).
        """
        pmix = (self._get("PMIX_NAMESPACE") or "").replace("/", "-")[:60]
        if given is not None:  # as given, even empty: the layout refuses a bad id by name
            return given
        return self._get("MPSWRAP_JOB") or self.job_id or pmix or fresh

    @property
    def job_uid(self) -> int | None:
        value = self._get("SLURM_JOB_UID")
        return int(value) if value and value.isdigit() else None

    @property
    def job_gid(self) -> int | None:
        value = self._get("SLURM_JOB_GID")
        return int(value) if value and value.isdigit() else None

    @property
    def node(self) -> str:
        return self._get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]

    @property
    def script_context(self) -> str | None:
        return self._get("SLURM_SCRIPT_CONTEXT")

    @property
    def job_gpus(self) -> tuple[int, ...] | None:
        """The job's GPUs on this node as gres.conf positions (prolog/epilog)."""
        text = self._get("SLURM_JOB_GPUS")
        if text is None and self.script_context:
            text = self._get("CUDA_VISIBLE_DEVICES")
        return parse_int_list(text, "SLURM_JOB_GPUS") if text else None

    @property
    def step_gpus(self) -> tuple[int, ...] | None:
        text = self._get("SLURM_STEP_GPUS") or self._get("SLURM_JOB_GPUS")
        return parse_int_list(text, "SLURM_STEP_GPUS") if text else None

    @property
    def mps_percentage(self) -> float | None:
        text = self._get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        try:
            return float(text) if text else None
        except ValueError:
            return None

    @property
    def step_id(self) -> str | None:
        return self._get("SLURM_STEP_ID") or self._get("SLURM_STEPID")

    @property
    def is_real_step(self) -> bool:
        """A task of a numbered step (not the batch or extern step)."""
        step = self.step_id
        return step is not None and step.isdigit()

    @property
    def cpus_allowed(self) -> frozenset[int] | None:
        try:
            return frozenset(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return None

    # --- ranks -----------------------------------------------------------------------
    @property
    def local_rank(self) -> int | None:
        return self._first_int(LOCAL_RANK_VARS)[0]

    @property
    def local_size(self) -> int | None:
        value, _ = self._first_int(LOCAL_SIZE_VARS)
        if value is not None:
            return value
        text = self._get("SLURM_STEP_TASKS_PER_NODE") or self._get("SLURM_TASKS_PER_NODE")
        if text:
            node_id = self._get("SLURM_NODEID") or "0"
            return tasks_per_node(text, int(node_id) if node_id.isdigit() else 0)
        return None

    @property
    def rank(self) -> int | None:
        return self._first_int(RANK_VARS)[0]
