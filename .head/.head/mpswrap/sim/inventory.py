"""A fake NVML inventory (JSON) in the format mpswrap.gpu reads for ``gpu_inventory=FILE``.

Minor numbers run opposite to NVML indices (index i has minor n-1-i), because on real nodes
the two orders can differ: code that confuses them fails against this inventory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DRIVER_VERSION = "580.159.04"
CUDA_DRIVER_VERSION = 13000
NAME = "NVIDIA H100 80GB HBM3 (simulated)"
MEMORY_TOTAL = 85899345920


def gpu_uuid(index: int) -> str:
    """Deterministic and readable: GPU-5a1d0000-0000-4000-8000-00000000000<index>."""
    return f"GPU-5a1d{index:04x}-0000-4000-8000-{index:012x}"


def cpu_list(cpus: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    start = prev = ordered[0] if ordered else 0
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(parts) if ordered else ""


def _numa_halves(cpus: Sequence[int]) -> tuple[list[int], list[int]]:
    """Node 0 takes the first half of the CPUs, node 1 the rest (both all, with one CPU)."""
    ordered = sorted(set(cpus))
    if len(ordered) < 2:
        return ordered, ordered
    half = len(ordered) // 2
    return ordered[:half], ordered[half:]


def fake_inventory(n_gpus: int = 2, cpus: Sequence[int] | None = None) -> dict[str, Any]:
    """n_gpus H100s in NVML index order; GPUs alternate between NUMA nodes 0 and 1."""
    halves = _numa_halves(range(os.cpu_count() or 1) if cpus is None else cpus)
    gpus = [
        {
            "index": i,
            "uuid": gpu_uuid(i),
            "minor": n_gpus - 1 - i,
            "name": NAME,
            "compute_capability": [9, 0],
            "cpus": cpu_list(halves[i % 2]),
            "numa_node": i % 2,
            "mig": False,
            "memory_total": MEMORY_TOTAL,
            "pci_bus_id": f"{i // 16:08X}:{(0x18 + 0x10 * i) % 0x100:02X}:00.0",
        }
        for i in range(n_gpus)
    ]
    return {
        "driver_version": DRIVER_VERSION,
        "cuda_driver_version": CUDA_DRIVER_VERSION,
        "gpus": gpus,
    }


def write_inventory(
    path: str | os.PathLike[str], n_gpus: int = 2, cpus: Sequence[int] | None = None
) -> Path:
    out = Path(path)
    out.write_text(json.dumps(fake_inventory(n_gpus, cpus), indent=2) + "\n")
    return out
