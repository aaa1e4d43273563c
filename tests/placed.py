"""Where the placement policy puts each rank of a run on one node: what a test compares a
real run with (the GPU a rank's daemon serves, the GPU nvidia-smi lists its process on), on
the simulator and on real GPUs. The policies themselves are mpswrap's
(``mpswrap.job.placement``; their definitions are pinned by tests/unit/test_placement.py)."""

from __future__ import annotations

from collections.abc import Sequence

from mpswrap.job.placement import choose_gpu, gpus_used

__all__ = ["placed"]


def placed(
    policy: str,
    ranks: int,
    gpus: Sequence[str],
    *,
    gpu_cpus: Sequence[frozenset[int]] | None = None,
    rank_cpus: frozenset[int] | None = None,
) -> list[str]:
    """The GPU of each of ``ranks`` ranks, by ``policy``, out of ``gpus`` (UUIDs, in NVML
    order; or any names, e.g. a group of GPUs each). A run in user mode starts daemons only
    on the GPUs its ranks use (every one under affinity) and places ranks among those.
    ``gpu_cpus``: each GPU's local CPUs, and ``rank_cpus``: the CPUs of the ranks (affinity)."""
    used = gpus_used(ranks, len(gpus), policy)
    names = [gpus[i] for i in used]
    cpus = [gpu_cpus[i] for i in used] if gpu_cpus is not None else None
    return [
        names[choose_gpu(r, ranks, len(names), policy=policy, rank_cpus=rank_cpus, gpu_cpus=cpus)]
        for r in range(ranks)
    ]
