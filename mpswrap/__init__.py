"""mpswrap: many CUDA processes per GPU through NVIDIA MPS, on Slurm clusters.

``import mpswrap`` loads neither NVML nor mpi4py: session() imports them when entered.
"""

from __future__ import annotations

from .entry.session import session
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
    "session",
]
