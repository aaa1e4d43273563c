"""Placement: which GPU each local rank gets, its client environment, and whether it fits.

One ``place()`` for every entry point (``mpswrap run``, the per-rank wrapper, ``session()``,
the task prolog) and one capacity check that counts the clients already running. Pure: the
GPUs (``Slot``) and the limits are passed in; nothing here loads NVML or talks to a daemon.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from .. import values
from .._struct import Struct
from ..errors import CapacityError, GpuError, UsageError
from ..jobenv import GpuRef
from ..mps.control import client_env
from ..mps.gpu import Inventory
from ..paths import GpuDirs

__all__ = [
    "Placement",
    "Slot",
    "check_capacity",
    "check_mem_limit",
    "check_total",
    "choose_gpu",
    "gpus_used",
    "place",
    "plan_positions",
    "provision_threads",
    "slot_of",
    "step_slots",
]

POLICIES = ("block", "cyclic", "affinity")


def choose_gpu(
    local_rank: int,
    local_size: int,
    n_gpus: int,
    *,
    policy: str = "block",
    rank_cpus: frozenset[int] | None = None,
    gpu_cpus: Sequence[frozenset[int]] | None = None,
) -> int:
    """Position (0..n_gpus-1) of the GPU for ``local_rank`` of ``local_size`` ranks.

    block: consecutive ranks share a GPU (0,0,1,1); cyclic: round robin (0,1,0,1);
    affinity: among the GPUs whose local CPUs overlap the rank's CPUs, by block order within
    them (falls back to block when nothing overlaps or CPU sets are unknown).
    """
    if n_gpus < 1:
        raise UsageError("no GPUs to place ranks on")
    if not 0 <= local_rank < max(local_size, 1):
        raise UsageError("local rank out of range", thing=f"{local_rank} of {local_size}")
    if policy not in POLICIES:
        raise UsageError("unknown GPU policy", thing=policy, hint=f"use one of {POLICIES}")
    if policy == "cyclic":
        return local_rank % n_gpus
    if policy == "affinity" and rank_cpus and gpu_cpus:
        near = [i for i, cpus in enumerate(gpu_cpus) if cpus & rank_cpus]
        if near:
            return near[local_rank % len(near)]
    # Balanced blocks: GPU loads differ by at most one rank, none idle while another has two.
    return local_rank * n_gpus // max(local_size, 1)


def plan_positions(local_size: int, n_gpus: int, policy: str = "block") -> list[int]:
    """GPU position of every local rank (affinity needs per-rank CPUs: block is used)."""
    policy = "block" if policy == "affinity" else policy
    return [choose_gpu(r, local_size, n_gpus, policy=policy) for r in range(local_size)]


def gpus_used(clients: int, n_gpus: int, policy: str) -> list[int]:
    """Positions of the GPUs that ``clients`` ranks placed by ``policy`` use: the only ones a
    run starts daemons for. Block and cyclic place each rank on the same GPU among those used
    as among all of them; affinity depends on each rank's CPUs, so every GPU counts."""
    if policy == "affinity":
        return list(range(n_gpus))
    return sorted(set(plan_positions(clients, n_gpus, policy))) if n_gpus else []


def provision_threads(spec: str | None, n_on_gpu: int, index_on_gpu: int) -> float | None:
    """Active thread percentage for one client from ``--threads``.

    none → no limit; uniform → 100/n; oversubscribe → min(100, 200/n); a number → that
    percentage; ``w1:w2:…`` → weights proportional, the heaviest client gets 100·w/Σw scaled so
    the shares add up to 100.
    """
    if spec in (None, "none"):
        return None
    try:  # plain decimals in ASCII digits, as the setting takes (not 5_0, 1e1, nan, 1e308)
        values.threads(spec)
    except ValueError as exc:
        raise UsageError("bad --threads", thing=spec, cause=str(exc)) from None
    n = max(1, n_on_gpu)
    if spec == "uniform":
        value = 100.0 / n
    elif spec == "oversubscribe":
        value = min(100.0, 200.0 / n)
    elif ":" in spec:
        weights = values.weights(spec)
        weight = weights[index_on_gpu % len(weights)]
        total = sum(weights[i % len(weights)] for i in range(n))
        value = 100.0 * weight / total
    else:
        value = values.percent(spec)
    return values.share_percent(value)


def slot_of(ref: GpuRef, slots: Sequence[Slot]) -> Slot | None:
    """The daemon of one of Slurm's GPUs: by its gres position's key, or by its UUID."""
    for slot in slots:
        if slot.key == f"g{ref}" or (isinstance(ref, str) and slot.uuid.lower() == ref.lower()):
            return slot
    return None


def step_slots(refs: Sequence[GpuRef] | None, slots: Sequence[Slot]) -> list[Slot]:
    """The job's daemons a step of it may use: those of the GPUs Slurm names for the step
    (``JobEnv.step_gpus``), all where it names none. A GPU named without a daemon is
    refused: its ranks would otherwise land on a GPU of another step."""
    if not refs:
        return list(slots)
    found = [slot_of(ref, slots) for ref in refs]
    if None in found:
        missing = [str(r) for r, s in zip(refs, found, strict=True) if s is None]
        raise GpuError(
            "no MPS daemon for these GPUs",
            thing=", ".join(missing),
            cause="the job's daemons (prolog) serve other GPUs",
        )
    return list(dict.fromkeys(s for s in found if s is not None))


class Slot(Struct, frozen=True):
    """A GPU ranks may be placed on: its daemon's directories and what placement needs."""

    dirs: GpuDirs
    uuid: str
    cpus: frozenset[int] = frozenset()
    memory_total: int = 0
    #: The GPU's index on the node (NVML's, as nvidia-smi shows it); None: not known here.
    index: int | None = None

    @classmethod
    def of(cls, dirs: GpuDirs, uuid: str, inventory: Inventory | None) -> Slot:
        if inventory is None:
            return cls(dirs, uuid)
        gpu = inventory.by_uuid(uuid)
        return cls(dirs, uuid, gpu.cpus, gpu.memory_total, gpu.index)

    @property
    def key(self) -> str:
        return self.dirs.key

    def number(self, position: int) -> int:
        """How messages number this GPU: its index on the node, else its ``position`` among
        the run's GPUs."""
        return position if self.index is None else self.index


class Placement(Struct, frozen=True):
    """One local rank's GPU and client environment."""

    position: int
    slot: Slot
    env: dict[str, str]
    threads: float | None

    @property
    def uuid(self) -> str:
        return self.slot.uuid


def place(
    slots: Sequence[Slot],
    local_rank: int,
    local_size: int,
    *,
    policy: str = "block",
    rank_cpus: frozenset[int] | None = None,
    threads: str | None = None,
    mem_limit: str | None = None,
    priority: int | None = None,
) -> Placement:
    """GPU and client environment of ``local_rank`` of ``local_size`` ranks."""
    gpu_cpus = [s.cpus for s in slots]
    position = choose_gpu(
        local_rank, local_size, len(slots), policy=policy, rank_cpus=rank_cpus, gpu_cpus=gpu_cpus
    )
    plan = plan_positions(local_size, len(slots), policy)
    sharing = max(plan.count(position), 1)
    index = plan[: min(local_rank, len(plan))].count(position)
    share = provision_threads(threads, sharing, index)
    slot = slots[position]
    env = client_env(
        slot.dirs,
        slot.uuid,
        threads=share,
        priority=priority,
        mem_limit=_mem_limit(mem_limit, slot, sharing),
    )
    return Placement(position, slot, env, share)


def _mem_limit(spec: str | None, slot: Slot, sharing: int) -> str | None:
    """``auto``: the GPU's memory shared equally by the ranks on it; else a size as given,
    refused where it is more than the GPU has (a limit that limits nothing is a typo)."""
    if spec != "auto":
        check_mem_limit([slot], spec)
        return spec
    if slot.memory_total <= 0:
        raise UsageError(
            "--mem-limit auto needs the GPU's memory size",
            thing=slot.uuid,
            cause="the inventory does not say",
            hint="give a size, e.g. 8G",
        )
    return f"{max(1, slot.memory_total // sharing // 2**20)}M"


def check_mem_limit(slots: Sequence[Slot], spec: str | None) -> None:
    """Refuse a ``--mem-limit`` size more than a GPU of ``slots`` has: a limit that limits
    nothing is a typo (``800G`` for ``80G``)."""
    if spec is None or spec == "auto":
        return
    size = int(spec[:-1]) * (2**30 if spec.endswith("G") else 2**20)
    for slot in slots:
        if 0 < slot.memory_total < size:
            raise UsageError(
                f"--mem-limit {spec} is more than the GPU's memory",
                thing=slot.uuid,
                cause=f"{slot.memory_total // 2**20}M in all",
                hint=f"give at most {slot.memory_total // 2**20}M, or auto",
            )


def check_total(
    uuids: Sequence[str],
    clients: int,
    limits: Mapping[str, int],
    running: Mapping[str, int] | None = None,
) -> None:
    """Refuse at once ``clients`` more than the GPUs ``uuids`` take together: none of the
    work that grows with the number of clients (placing each) is done for a request that
    cannot fit however it is placed (``run -n 100000000``)."""
    running = running or {}
    if len(uuids) == 1:
        _refuse_over(uuids[0], clients, running.get(uuids[0], 0), limits[uuids[0]])
        return
    free = sum(max(0, limits[u] - running.get(u, 0)) for u in uuids)
    if clients > free:
        raise CapacityError(
            "too many MPS clients for the GPUs",
            thing=f"{len(uuids)} GPU(s)",
            cause=f"{clients} new > {free} they take together",
            hint=_HINT,
            wanted=clients,
            limit=free,
        )


def check_capacity(
    uuids: Sequence[str],
    local_size: int,
    policy: str,
    limits: Mapping[str, int],
    running: Mapping[str, int] | None = None,
) -> None:
    """Refuse, before anything starts, when ``local_size`` new ranks placed on the GPUs
    ``uuids`` by ``policy``, plus the clients already ``running`` (per UUID), would give a GPU
    more clients than its limit."""
    running = running or {}
    wanted = Counter(uuids[p] for p in plan_positions(local_size, len(uuids), policy))
    for uuid, count in wanted.items():
        _refuse_over(uuid, count, running.get(uuid, 0), limits[uuid])


_HINT = "use fewer ranks per GPU, more GPUs, or set client_limit if your driver allows more"


def _refuse_over(uuid: str, count: int, running: int, limit: int) -> None:
    if count + running > limit:
        raise CapacityError(
            "too many MPS clients for one GPU",
            thing=uuid,
            cause=f"{count} new + {running} running > limit {limit}",
            hint=_HINT,
            uuid=uuid,
            wanted=count + running,
            limit=limit,
        )
