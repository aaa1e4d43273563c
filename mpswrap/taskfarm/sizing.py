"""How many tasks a farm runs at once on a GPU before it has measured anything: the most auto
goes to (``auto_cap``), where it starts (``default_per_gpu``), and ``--per-gpu``'s value."""

from __future__ import annotations

from .. import values
from ..errors import UsageError
from .packing import start_k

__all__ = ["auto_cap", "default_per_gpu", "per_gpu_value"]


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
