"""A typed, read-only view of the Slurm / MPI / launcher environment.

Built from a mapping so tests pass a dict. The local rank follows the innermost-launcher rule:
an ``mpirun`` inside a batch job inherits ``SLURM_LOCALID=0`` for every rank, so the MPI
launchers' variables win over Slurm's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ._struct import Struct
from .errors import ConfigError, MpswrapError, UsageError
from .paths import validate_name

__all__ = [
    "ATTEMPT_VAR",
    "PLACE_IN_LAUNCH_VARS",
    "TASK_VAR",
    "TREE_VAR",
    "UUID_RE",
    "GpuRef",
    "JobEnv",
    "parse_gpu_list",
    "parse_int_list",
]

#: A GPU in Slurm's lists: a gres position (``2``) or a UUID (``GPU-…``, ``MIG-…``).
GpuRef = int | str
_HEX_UUID = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
#: A GPU UUID as NVML writes it; a MIG device's in the current form (``MIG-<uuid>``, R470
#: and later) or the earlier ``MIG-GPU-<uuid>/<gi>/<ci>``.
UUID_RE = re.compile(rf"GPU-{_HEX_UUID}|MIG-{_HEX_UUID}|MIG-GPU-{_HEX_UUID}/[0-9]+/[0-9]+")
#: One item of a GPU list: a position, a range of them, or a UUID.
_GPU_ITEM = re.compile(
    rf"(?P<lo>[0-9]{{1,4}})(?:-(?P<hi>[0-9]{{1,4}}))?|(?P<uuid>{UUID_RE.pattern})"
)
_ASCII_NUMBER = re.compile(r"[0-9]{1,7}")
_MAX_GPU_POSITION = 999  # a daemon's key is g<position>, three digits at most
_WHOLE = re.compile(r"-?[0-9]{1,9}")
_COUNT = re.compile(r"[0-9]{1,9}")
#: Slurm's display forms of an array task (``123_4``) and a het-job component (``123+0``).
_DISPLAY_JOB_ID = re.compile(r"[0-9]+[_+][0-9]+")

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
#: Set by ``mpswrap LAUNCHER ...`` for its ranks: ``LOCAL_RANK_NAME,LOCAL_SIZE_NAME`` of that
#: launcher (``job.launchers``), read before every other rank variable.
RANK_VARS_VAR = "MPSWRAP_RANK_VARS"
#: What srun itself sets as a task's rank (its own, and its PMI-2 and PMIx plugins').
SRUN_RANK_VARS = ("SLURM_PROCID", "PMI_RANK", "PMIX_RANK")
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
#: A process's place in a launch: its rank and local rank, and the sizes and node numbers
#: beside them (what ``rank``, ``local_rank``, ``local_size`` and ``step_task`` read, and
#: what frameworks such as PyTorch Lightning read). A process started on its own, as a farm's
#: task is, must not inherit them from the step that started its starter.
PLACE_IN_LAUNCH_VARS = frozenset(
    {
        *RANK_VARS,
        *LOCAL_RANK_VARS,
        *LOCAL_SIZE_VARS,
        "MPSWRAP_NPROCS",
        "WORLD_SIZE",
        "PMI_SIZE",
        "OMPI_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_SIZE",
        "SLURM_NTASKS",
        "SLURM_NPROCS",
        "SLURM_STEP_NUM_TASKS",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_TASKS_PER_NODE",
        "SLURM_STEP_TASKS_PER_NODE",
        "SLURM_NODEID",
    }
)


#: Kinds of run whose fallback job is shared by every process of the node (``run_job``).
SHARED_FALLBACK = frozenset({"rank", "session", "start"})

#: Tags a rank and everything it starts, so that the rank's whole tree ends with it
#: (``job.supervise.end_leftovers``); never passed to a process that is not the rank's.
TREE_VAR = "MPSWRAP_TREE"

#: A farm task's number (from 0) and which run of it this is (from 1), in its environment.
TASK_VAR, ATTEMPT_VAR = "MPSWRAP_TASK", "MPSWRAP_TASK_ATTEMPT"


def tasks_per_node(spec: str, node_id: int) -> int | None:
    """This node's count from Slurm's ``2(x3),1`` style lists (None if malformed)."""
    counts: list[int] = []
    for part in spec.split(","):
        head, _, rest = part.strip().partition("(x")
        if not _COUNT.fullmatch(head) or (rest and not _COUNT.fullmatch(rest.rstrip(")"))):
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
            if not _ASCII_NUMBER.fullmatch(lo) or (sep and not _ASCII_NUMBER.fullmatch(hi)):
                raise ValueError(part)  # int() takes '٣', '1_0' and ' 7 ', a list does not
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


def parse_gpu_list(text: str, what: str) -> tuple[GpuRef, ...]:
    """Slurm's GPU lists: gres positions (``0,2``), ranges (``0-3``) and UUIDs, each GPU once.

    slurmd writes positions joined by ``,`` (``SLURM_JOB_GPUS``, ``SLURM_STEP_GPUS``), or UUIDs
    in ``CUDA_VISIBLE_DEVICES`` where gres.conf gives them; ranges are accepted too. A GPU
    named twice is kept once, in its first place: a repeat must cost nothing, never a wait.
    """
    out: dict[GpuRef, None] = {}
    for item in (part.strip() for part in text.split(",")):
        match = _GPU_ITEM.fullmatch(item)
        if match is None:
            raise ConfigError(
                f"malformed {what}",
                thing=repr(text),
                cause="expected GPU numbers like 0,2-3 or GPU UUIDs",
            )
        if match["uuid"]:
            out.setdefault(item, None)
            continue
        first, last = int(match["lo"]), int(match["hi"] or match["lo"])
        if last < first or last > _MAX_GPU_POSITION:
            raise ConfigError(f"malformed {what}", thing=repr(text), cause=f"bad range {item!r}")
        out.update(dict.fromkeys(range(first, last + 1)))
    return tuple(out)


def _id_number(name: str, text: str | None) -> int | None:
    """A uid or gid as slurmd writes it (a decimal number below 2**32 - 1), None if unset."""
    if text is None:
        return None
    if not re.fullmatch(r"[0-9]{1,10}", text) or int(text) >= 2**32 - 1:
        raise ConfigError(f"malformed {name}", thing=repr(text), cause="expected a number")
    return int(text)


class JobEnv(Struct, frozen=True):
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
            if not _WHOLE.fullmatch(value):
                raise ConfigError(
                    f"malformed {name}", thing=repr(value), cause="expected a whole number"
                )
            return int(value), name
        return None, None

    # --- job -------------------------------------------------------------------------
    @property
    def job_id(self) -> str | None:
        return self._get("SLURM_JOB_ID") or self._get("SLURM_JOBID")

    def slurm_job(self) -> str:
        """Slurm's job id, checked: what the hooks keep a job's state under.

        slurmd writes a number (an array task and a het-job component each have their own;
        ``123_4`` and ``123+0`` are only how squeue shows them); any one safe name passes.
        """
        job = self.job_id
        if job is None:
            raise MpswrapError("SLURM_JOB_ID is not set")
        validate_name("node name", self.node)
        return validate_name("job id", job)

    @property
    def nodes_text(self) -> str | None:
        """The allocation's node count as Slurm writes it (``2``, or ``1-3`` before start)."""
        return self._get("SLURM_NNODES") or self._get("SLURM_JOB_NUM_NODES")

    @property
    def ntasks_text(self) -> str | None:
        """The allocation's task count as Slurm writes it."""
        return self._get("SLURM_NTASKS")

    def run_job(self, given: str | None, kind: str) -> str:
        """THE job id of a run of ``kind`` (``run``, ``farm``, ``calibrate``, ``mpirun``,
        ``rank``, ``session``, ``start``): ``job_key``'s, else the one fallback name. A run
        that is its job's only owner names a job of its own, ``<kind>-<pid>``; the ranks of no
        launcher
        (``mpswrap ./app``, ``session()`` in a plain process) and ``mpswrap start`` share the
        job ``local``."""
        fresh = "local" if kind in SHARED_FALLBACK else f"{kind}-{os.getpid()}"
        found = self.job_key(given)
        return fresh if found is None else found

    def job_key(self, given: str | None = None, fresh: str | None = None) -> str | None:
        """THE job id mpswrap keeps a job's state under, the same for every rank of a node.

        In order: ``given`` (``--job``), ``MPSWRAP_JOB`` (set by the launcher for its ranks),
        Slurm's job id, the PMIx namespace (ranks of one ``mpirun``), then ``fresh`` (what the
        caller names a job of its own, e.g. ``run-<pid>``; None: no job is known).
        """
        # The namespace as one path component: any character a job id may not hold becomes
        # '-' (Open MPI 5's PRRTE names ranks' namespaces 'prterun-<host>-<pid>@1').
        pmix = re.sub(r"[^A-Za-z0-9._-]", "-", self._get("PMIX_NAMESPACE") or "")[:60]
        if given is not None and _DISPLAY_JOB_ID.fullmatch(given):
            raise UsageError(
                "not a job id mpswrap knows",
                thing=given,
                cause="an array task or het-job component keeps its state under its own number",
                hint=f"the number is JobId= in: scontrol show job {given}",
            )
        if given is not None:  # as given, even empty: the layout refuses a bad id by name
            return given
        return self._get("MPSWRAP_JOB") or self.job_id or pmix or fresh

    @property
    def job_uid(self) -> int | None:
        return _id_number("SLURM_JOB_UID", self._get("SLURM_JOB_UID"))

    @property
    def job_gid(self) -> int | None:
        return _id_number("SLURM_JOB_GID", self._get("SLURM_JOB_GID"))

    @property
    def job_user(self) -> str | None:
        """The user name slurmd gives beside the uid (the prolog checks that they agree)."""
        return self._get("SLURM_JOB_USER")

    @property
    def node(self) -> str:
        # uname's node name is what gethostname() returns, without importing socket.
        return self._get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]

    @property
    def script_context(self) -> str | None:
        return self._get("SLURM_SCRIPT_CONTEXT")

    @property
    def job_gpus_text(self) -> str | None:
        """Slurm's list of the job's GPUs on this node, unparsed (prolog/epilog)."""
        text = self._get("SLURM_JOB_GPUS")
        if text is None and self.script_context:
            text = self._get("CUDA_VISIBLE_DEVICES")
        return None if text == "NoDevFiles" else text  # Slurm's word for "no device files"

    @property
    def job_gpus(self) -> tuple[GpuRef, ...] | None:
        """The job's GPUs on this node: gres.conf positions, or UUIDs (prolog/epilog)."""
        text = self.job_gpus_text
        return parse_gpu_list(text, "SLURM_JOB_GPUS") if text else None

    @property
    def step_gpus(self) -> tuple[GpuRef, ...] | None:
        """The step's GPUs: Slurm's gres positions, else the GPU UUIDs of
        ``CUDA_VISIBLE_DEVICES`` (Slurm 26.05's ``gres.conf Flags=env_uuid``); None where
        neither names them (numbers in ``CUDA_VISIBLE_DEVICES`` may be renumbered by the
        step's device cgroup: they name no gres position)."""
        text = self._get("SLURM_STEP_GPUS") or self._get("SLURM_JOB_GPUS")
        if text:
            return parse_gpu_list(text, "SLURM_STEP_GPUS")
        cvd = self._get("CUDA_VISIBLE_DEVICES") or ""
        if cvd and all(UUID_RE.fullmatch(w.strip()) for w in cvd.split(",")):
            return parse_gpu_list(cvd, "CUDA_VISIBLE_DEVICES")
        return None

    @property
    def mps_percentage(self) -> float | None:
        """Slurm's share of the GPU for a gres/mps job, a percentage in (0, 100]."""
        value = self.mps_job_percentage
        if value is not None and value > 100:
            raise ConfigError(
                "malformed CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                thing=repr(self._get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")),
                cause="expected a percentage in (0, 100]",
            )
        return value

    @property
    def mps_job_percentage(self) -> float | None:
        """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` as Slurm sets it for a gres/mps job: above 100
        where one job has shares of several GPUs (23.11+, ``MULTIPLE_SHARING_GRES_PJ``)."""
        text = self._get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        if text is None:
            return None
        if not re.fullmatch(r"[0-9]{1,5}(\.[0-9]+)?", text) or not float(text) > 0:
            raise ConfigError(
                "malformed CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                thing=repr(text),
                cause="expected a positive percentage",
            )
        return float(text)

    @property
    def mps_request(self) -> str | None:
        """``--mps[=POLICY]`` of the SPANK plugin (prolog/epilog): the policy, ``default``
        for a plain ``--mps``; None when the job was submitted without it."""
        return self._get("SPANK_MPSWRAP_MPS")

    @property
    def step_id(self) -> str | None:
        return self._get("SLURM_STEP_ID") or self._get("SLURM_STEPID")

    @property
    def is_real_step(self) -> bool:
        """A task of a numbered step (not the batch or extern step)."""
        step = self.step_id
        return step is not None and re.fullmatch(r"[0-9]{1,10}", step) is not None

    @property
    def step_task(self) -> tuple[int, int] | None:
        """(task, tasks) of a task of a numbered step (``srun``): ``SLURM_PROCID`` of
        ``SLURM_STEP_NUM_TASKS``; None outside one (the batch script, a login shell)."""
        if not self.is_real_step:
            return None
        rank, _ = self._first_int(("SLURM_PROCID",))
        size, _ = self._first_int(("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
        if rank is None or size is None or not 0 <= rank < size:
            return None
        return rank, size

    @property
    def srun_step(self) -> str | None:
        """``JOB.STEP`` when this process may be one of several tasks srun itself started:
        no MPI launcher's own rank variable comes first (srun's PMI plugins set ``PMI_RANK``
        or ``PMIX_RANK``, as the launchers do: ``slurm.scontrol.signal_step`` also asks the
        process tree). What a task signals to end its fellow tasks; None elsewhere."""
        task, job = self.step_task, self.job_id
        if task is None or task[1] < 2 or job is None or not _COUNT.fullmatch(job):
            return None
        if self._first_int(RANK_VARS)[1] not in SRUN_RANK_VARS:
            return None
        return f"{job}.{self.step_id}"

    @property
    def cpus_allowed(self) -> frozenset[int] | None:
        try:
            return frozenset(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return None

    @property
    def cpu_count(self) -> int:
        """The CPUs this process may use (its affinity), else the machine's: what the farm's
        K and calibrate's counts share among tasks."""
        return len(self.cpus_allowed or ()) or os.cpu_count() or 1

    # --- ranks -----------------------------------------------------------------------
    @property
    def local_rank(self) -> int | None:
        own, *rest = LOCAL_RANK_VARS  # mpswrap's own (``mpswrap run``) always first
        return self._first_int((own, *self._launched_by(0, LOCAL_RANK_VARS), *rest))[0]

    def _launched_by(self, which: int, known: tuple[str, ...]) -> tuple[str, ...]:
        """The rank variable (``which`` 0: local rank, 1: local size) of the launcher that
        ``mpswrap LAUNCHER ...`` started this rank under (``MPSWRAP_RANK_VARS``, set for its
        ranks): the innermost launcher's, first. Inside a Slurm job every rank inherits
        ``SLURM_LOCALID`` of the step that ran the launcher (torchrun's workers all 0)."""
        names = (self._get(RANK_VARS_VAR) or "").split(",")
        name = names[which] if len(names) == 2 else ""
        return (name,) if name in known else ()

    @property
    def gpus_per_task(self) -> int | None:
        """``--gpus-per-task`` of the step (``SLURM_GPUS_PER_TASK``), None where not given or
        not a whole number."""
        found, _ = self._first_int(("SLURM_GPUS_PER_TASK",))
        return found

    @property
    def local_size(self) -> int | None:
        own, *rest = LOCAL_SIZE_VARS
        value, _ = self._first_int((own, *self._launched_by(1, LOCAL_SIZE_VARS), *rest))
        if value is not None:
            return value
        text = self._get("SLURM_STEP_TASKS_PER_NODE") or self._get("SLURM_TASKS_PER_NODE")
        if text:
            node_id = self._get("SLURM_NODEID") or "0"
            return tasks_per_node(text, int(node_id) if _COUNT.fullmatch(node_id) else 0)
        return None

    @property
    def rank(self) -> int | None:
        return self._first_int(RANK_VARS)[0]

    @property
    def farm_task(self) -> int | None:
        """The number of the farm task this process belongs to (``TASK_VAR``), or None."""
        return self._first_int((TASK_VAR,))[0]
