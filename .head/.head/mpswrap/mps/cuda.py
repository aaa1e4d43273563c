"""Has CUDA started in this process? Asked without ever initialising CUDA.

``session()`` must set the MPS variables before CUDA initialises: a process whose CUDA runs
already ignores them (or runs without MPS, silently).
"""

from __future__ import annotations

import ctypes
import os
import sys

from ..errors import MpswrapError
from .gpu import Inventory

__all__ = ["cuda_error", "cuda_started", "mps_client"]

CU_DEVICE_ATTRIBUTE_MPS_ENABLED = 133


def cuda_started(inventory: Inventory) -> str | None:
    """Why CUDA counts as started here, or None. Never initialises CUDA itself."""
    pid = os.getpid()
    for gpu in inventory.gpus:
        if pid in inventory.compute_pids(gpu.uuid):
            return f"NVML lists this process (pid {pid}) as a compute process of {gpu.uuid}"
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return "torch.cuda.is_initialized() is True"
    except AttributeError:
        pass
    return _driver_context()


def _driver_context() -> str | None:
    """A CUDA context in this process (CuPy, Numba, ...), asked of an already loaded
    libcuda only: before cuInit the driver answers NOT_INITIALIZED and stays uninitialised."""
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None  # not loaded: nothing in this process has used CUDA
    ctx = ctypes.c_void_p()
    if lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 0:
        return None  # CUDA_ERROR_NOT_INITIALIZED: cuInit has not run
    if ctx.value:
        return "a CUDA context is current in this process"
    count, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    lib.cuDeviceGetCount(ctypes.byref(count))
    for index in range(count.value):
        dev = ctypes.c_int()
        lib.cuDeviceGet(ctypes.byref(dev), index)
        lib.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))
        if active.value:
            return f"the primary CUDA context of device {index} is active"
    return None


def cuda_error(reason: str) -> MpswrapError:
    return MpswrapError(
        "CUDA is already initialised in this process",
        thing=f"pid {os.getpid()}",
        cause=f"{reason}; it would ignore the MPS variables (or run without MPS, silently)",
        hint="enter mpswrap.session() before any CUDA use (before creating tensors or "
        "importing code that touches the GPU), or run the program under the launcher: "
        "`mpswrap mpirun -np N python app.py`",
        context="session",
    )


def mps_client() -> bool | None:
    """Whether this process's current CUDA context runs through MPS, as the driver says
    (``CU_DEVICE_ATTRIBUTE_MPS_ENABLED``): the answer where PIDs are not comparable with the
    daemon's (another PID namespace, a container). Asked of an already loaded libcuda only;
    None where it cannot say (no CUDA here yet, no current context, an older driver)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None
    ctx, dev, value = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
    if lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
        return None
    if lib.cuCtxGetDevice(ctypes.byref(dev)) != 0:
        return None
    if lib.cuDeviceGetAttribute(ctypes.byref(value), CU_DEVICE_ATTRIBUTE_MPS_ENABLED, dev) != 0:
        return None  # e.g. a driver that does not know the attribute
    return bool(value.value)
