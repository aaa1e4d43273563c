"""One rank's side of MPS: which GPU, which environment, and whether it fits (pure logic).

A client gets its GPU daemon's pipe and log directories and ``CUDA_VISIBLE_DEVICES=<UUID>``:
attached it sees that GPU; if it ever falls back to running without MPS it still stays on its
own GPU instead of landing on device 0 with everyone else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .errors import CapacityError, UsageError
from .paths import GpuDirs

__all__ = [
    "ClientPlan",
    "check_capacity",
    "choose_gpu",
    "client_env",
    "provision_threads",
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


def provision_threads(spec: str | None, n_on_gpu: int, index_on_gpu: int) -> float | None:
    """Active thread percentage for one client from ``--threads``.

    none → no limit; uniform → 100/n; oversubscribe → min(100, 200/n); a number → that
    percentage; ``w1:w2:…`` → weights proportional, the heaviest client gets 100·w/Σw scaled so
    the shares add up to 100.
    """
    if spec in (None, "none"):
        return None
    n = max(1, n_on_gpu)
    if spec == "uniform":
        value = 100.0 / n
    elif spec == "oversubscribe":
        value = min(100.0, 200.0 / n)
    elif ":" in spec:
        weights = _weights(spec)
        weight = weights[index_on_gpu % len(weights)]
        total = sum(weights[i % len(weights)] for i in range(n))
        value = 100.0 * weight / total
    else:
        try:
            value = float(spec)
        except ValueError:
            raise UsageError(
                "bad --threads",
                thing=spec,
                hint="use none, uniform, oversubscribe, a percent or w1:w2:...",
            ) from None
        if not 0 < value <= 100:
            raise UsageError("bad --threads", thing=spec, cause="percent must be in (0, 100]")
    # Round down: shares of one GPU must not add up to more than 100 (6 x 16.7 = 100.2).
    return max(1.0, min(100.0, math.floor(value * 10 + 1e-9) / 10))


def _weights(spec: str) -> list[float]:
    try:
        weights = [float(w) for w in spec.split(":")]
    except ValueError:
        raise UsageError("bad --threads weights", thing=spec) from None
    if not weights or any(w <= 0 for w in weights):
        raise UsageError("bad --threads weights", thing=spec, cause="weights must be > 0")
    return weights


def client_env(
    dirs: GpuDirs,
    uuid: str,
    *,
    threads: float | None = None,
    mem_limit: str | None = None,
    priority: int | None = None,
) -> dict[str, str]:
    """The variables that attach one client to its GPU's daemon."""
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(dirs.log),
        "CUDA_VISIBLE_DEVICES": uuid,
    }
    if threads is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = f"{threads:g}"
    if mem_limit:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mem_limit}"
    if priority is not None:
        env["CUDA_MPS_CLIENT_PRIORITY"] = str(priority)
    return env


@dataclass(frozen=True)
class ClientPlan:
    """Where one rank goes: GPU position and UUID."""

    local_rank: int
    position: int
    uuid: str


def check_capacity(
    wanted: Mapping[str, int], limits: Mapping[str, int], existing: Mapping[str, int] | None = None
) -> None:
    """Refuse before launch when a GPU would get more clients than its server accepts."""
    existing = existing or {}
    for uuid, count in wanted.items():
        total = count + existing.get(uuid, 0)
        if total > limits[uuid]:
            raise CapacityError(
                "too many MPS clients for one GPU",
                thing=uuid,
                cause=f"{count} new + {existing.get(uuid, 0)} running > limit {limits[uuid]}",
                hint="use fewer ranks per GPU, more GPUs, or set client_limit if your "
                "driver allows more",
                uuid=uuid,
                wanted=total,
                limit=limits[uuid],
            )
