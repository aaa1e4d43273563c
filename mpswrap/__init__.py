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
