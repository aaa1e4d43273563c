"""How many tasks a farm runs at once on a GPU before it has measured anything: the most auto
goes to (``auto_cap``), where it starts (``default_per_gpu``), the fewest it lowers to for
CPU-light tasks (``cpu_floor``), and ``--per-gpu``'s value."""

from __future__ import annotations

from .. import values
from ..errors import UsageError
from .packing import start_k

__all__ = ["CPU_LIGHT", "auto_cap", "cpu_floor", "default_per_gpu", "per_gpu_value"]

#: Tasks that keep less than this share of a CPU busy while they run are CPU-light (a CPU-bound
#: task on a busy node still shows more, seen on the 2-CPU VM: 0.5 with two at once): their
#: throughput is the GPU's, and fewer of them at once than the CPUs allow saves nothing.
CPU_LIGHT = 0.25


def auto_cap(limit: int, n_gpus: int, cpus: int) -> int:
    """The most K auto goes to: the clients free on a GPU, and a CPU per task."""
    return max(1, min(limit, cpus // max(1, n_gpus)))


def default_per_gpu(limit: int, n_gpus: int, cpus: int) -> int:
    """Today's default K, where auto starts and the K of ``calibrate --max``: ``auto_cap``,
    at most ``packing.START_MAX``."""
    return start_k(auto_cap(limit, n_gpus, cpus))


def per_gpu_value(value: int | str | None) -> int | None:
    """``--per-gpu`` as ``farm()`` takes it: a K of 1 or more, or ``auto`` (None, as when not
    given); the text forms are ``values.per_gpu``'s."""
    if value is None:
        return None
    try:
        return values.per_gpu(str(value))
    except ValueError:
        raise UsageError(
            "bad --per-gpu", thing=str(value), hint="give auto or a K of 1 or more"
        ) from None


def cpu_floor(
    cpu_s: float, wall_s: float, cpus_per_gpu: int, cap: int, *, saturated: bool = False
) -> int:
    """The fewest K auto lowers to: a CPU per task (at most the cap) where the finished tasks
    were CPU-light (``cpu_s`` CPU seconds over ``wall_s`` seconds run, below ``CPU_LIGHT``),
    else 1. Measured from the tasks' own CPU time (``wait4``), so a task that mostly waits on
    its GPU is known as such; not on ``saturated`` CPUs (a load average at their count),
    where a CPU-bound task waits for a CPU and would look light."""
    if saturated or wall_s <= 0 or cpu_s / wall_s >= CPU_LIGHT:
        return 1
    return max(1, min(cap, cpus_per_gpu))
