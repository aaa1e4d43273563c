"""mpswrap: many CUDA processes per GPU through NVIDIA MPS, on Slurm clusters.

``import mpswrap`` loads neither NVML nor mpi4py; both are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from .session import session


def __getattr__(name: str) -> Any:
    # session() lives in a module that imports mpi4py lazily; keep `import mpswrap` light.
    if name == "session":
        from .session import session

        return session
    raise AttributeError(f"module 'mpswrap' has no attribute {name!r}")
