"""mpswrap: many CUDA processes per GPU through NVIDIA MPS, on Slurm clusters.

``import mpswrap`` loads neither NVML nor mpi4py: session() imports them when entered, and
``session``, ``farm`` and ``unshield`` are imported on first use (PEP 562), so the Slurm hooks
and the CLI, which import this package first, do not pay for the launcher's modules.
"""

from __future__ import annotations

from .errors import (
    CapacityError,
    ConfigError,
    ControlError,
    DaemonError,
    GpuError,
    LayoutError,
    MpswrapError,
    ProcError,
    UsageError,
)

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:
    from typing import Any

    from ._signals import unshield
    from .entry.farm import farm
    from .entry.session import session

__version__ = "0.1.0"

# Written out, not built from errors.__all__: the public surface is read by people and tools
# from this file alone (the `duplicates` pair with errors.py is this list, on purpose).
__all__ = [
    "CapacityError",
    "ConfigError",
    "ControlError",
    "DaemonError",
    "GpuError",
    "LayoutError",
    "MpswrapError",
    "ProcError",
    "UsageError",
    "__version__",
    "farm",
    "session",
    "unshield",
]


def __getattr__(name: str) -> Any:
    if name == "session":
        from .entry.session import session

        return session
    if name == "farm":
        from .entry.farm import farm

        return farm
    if name == "unshield":
        from ._signals import unshield

        return unshield
    raise AttributeError(f"module 'mpswrap' has no attribute {name!r}")
