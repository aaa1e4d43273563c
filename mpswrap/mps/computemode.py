"""A GPU's compute mode: read and set through NVML (as root), or in the simulator's
inventory file (``gpu_inventory = FILE``, its GPUs' ``compute_mode``).

For the admin option ``exclusive_process`` alone (entry/exclusive.py). Never called unless an
admin asked for it: changing a GPU's compute mode changes it for every job of the node.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .._lock import file_lock
from ..errors import GpuError
from ..paths import write_job_file
from .gpu import init_nvml, nvml_failed

__all__ = ["EXCLUSIVE", "MODES", "get_mode", "set_mode"]

#: NVML's compute modes by name (EXCLUSIVE_THREAD is gone since CUDA 11).
MODES = {"DEFAULT": 0, "PROHIBITED": 2, "EXCLUSIVE_PROCESS": 3}
EXCLUSIVE = "EXCLUSIVE_PROCESS"
#: Seconds to wait for another prolog's or epilog's change of the inventory file.
FILE_LOCK_TIMEOUT = 10.0


def get_mode(uuid: str, source: str) -> str:
    """The GPU's compute mode by name."""
    if source == "nvml":
        nvml = init_nvml()
        try:
            value = nvml.nvmlDeviceGetComputeMode(nvml.nvmlDeviceGetHandleByUUID(uuid))
        except nvml.NVMLError as exc:
            raise nvml_failed("nvmlDeviceGetComputeMode", exc) from exc
        names = {number: name for name, number in MODES.items()}
        if value not in names:
            raise GpuError("unknown compute mode", thing=uuid, cause=f"NVML says {value}")
        return names[value]
    return str(_gpu_entry(_read(Path(source)), uuid, source).get("compute_mode", "DEFAULT"))


def set_mode(uuid: str, mode: str, source: str) -> None:
    """Set the GPU's compute mode (``MODES``)."""
    if mode not in MODES:
        raise GpuError("unknown compute mode", thing=repr(mode), hint=f"one of {sorted(MODES)}")
    if source == "nvml":
        nvml = init_nvml()
        try:
            nvml.nvmlDeviceSetComputeMode(nvml.nvmlDeviceGetHandleByUUID(uuid), MODES[mode])
        except nvml.NVMLError as exc:
            raise nvml_failed("nvmlDeviceSetComputeMode", exc) from exc
        return
    path = Path(source)
    with file_lock(path.with_name(f".{path.name}.lock"), FILE_LOCK_TIMEOUT):
        data = _read(path)
        _gpu_entry(data, uuid, source)["compute_mode"] = mode
        owner = path.stat()
        write_job_file(path, json.dumps(data, indent=2) + "\n", owner.st_uid, owner.st_gid)


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise GpuError("cannot read GPU inventory file", thing=str(path), cause=str(exc)) from exc


def _gpu_entry(data: Any, uuid: str, source: str) -> dict[str, Any]:
    for gpu in data.get("gpus", []) if isinstance(data, dict) else []:
        if isinstance(gpu, dict) and str(gpu.get("uuid", "")).lower() == uuid.lower():
            return gpu
    raise GpuError("no such GPU", thing=uuid, cause=f"not in {source}")
