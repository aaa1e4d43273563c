"""The admin option ``exclusive_process``: a job's whole GPUs in compute mode
EXCLUSIVE_PROCESS while it runs, so that only its MPS server holds a context on them.

The prolog sets the mode on GPUs the job holds whole (gres/gpu, no gres/mps or shard share:
other jobs' processes may share those). Per node and GPU one root-owned file under run_dir
(``state.compute_mode_file``) keeps the mode found and the jobs that hold the GPU so. Each
epilog takes its own job off every such file of its node; the mode found goes back, and the
file goes, once no job holds the GPU and no other job has a daemon on it. A prolog that fails
does the same for its job at once. One lock per node spans every read, change and write of
these files and of the modes. A GPU found EXCLUSIVE_PROCESS already is left alone. Tested on
the simulator only: the GPU machine's compute mode is never changed.

A GPU's compute mode is read and set through NVML (as root), or in the simulator's inventory
file (``gpu_inventory = FILE``, its GPUs' ``compute_mode``). Nothing else in mpswrap changes
it: changing a GPU's compute mode changes it for every job of the node.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from .._lock import file_lock
from ..config import Settings
from ..errors import GpuError, LayoutError, MpswrapError
from ..jobenv import JobEnv
from ..mps.gpu import GpuInfo, init_nvml, nvml_failed
from ..paths import ROOT_ONLY, check_dirs, list_dir, read_job_file, validate_name, write_job_file
from ..slurm.scontrol import NodeShare
from . import state
from .job import JobDaemons

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = ["EXCLUSIVE", "MODES", "get_mode", "make_exclusive", "restore_modes", "set_mode"]

log = logging.getLogger(__name__)

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
    return str(
        _gpu_entry(_read_inventory(Path(source)), uuid, source).get("compute_mode", "DEFAULT")
    )


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
        data = _read_inventory(path)
        _gpu_entry(data, uuid, source)["compute_mode"] = mode
        owner = path.stat()
        write_job_file(path, json.dumps(data, indent=2) + "\n", owner.st_uid, owner.st_gid)


def _read_inventory(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise GpuError("cannot read GPU inventory file", thing=str(path), cause=str(exc)) from exc


def _gpu_entry(data: Any, uuid: str, source: str) -> dict[str, Any]:
    for gpu in data.get("gpus", []) if isinstance(data, dict) else []:
        if isinstance(gpu, dict) and str(gpu.get("uuid", "")).lower() == uuid.lower():
            return gpu
    raise GpuError("no such GPU", thing=uuid, cause=f"not in {source}")


#: The kept file: the mode found, then a job id a line.
KEPT_LIMIT = 64 << 10


def _read(kept: Path) -> tuple[str, list[str]] | None:
    text = read_job_file(kept, KEPT_LIMIT)
    if text is None:
        return None
    lines = text.split()
    mode = lines[0] if lines and lines[0] in MODES else "DEFAULT"
    return mode, lines[1:]


def make_exclusive(
    env: JobEnv, settings: Settings, share: NodeShare | None, gpus: Sequence[GpuInfo]
) -> None:
    """Before the daemons start: EXCLUSIVE_PROCESS on each GPU the job holds whole."""
    if share is None or not share.whole_gpus or env.mps_job_percentage is not None:
        log.info("compute mode left as it is: the job's GPUs are shared or Slurm did not say")
        return
    job = env.slurm_job()
    state.create_run_dir(state.admin_layout(settings, env.node, job))
    with file_lock(state.compute_mode_lock(settings, env.node), settings.start_timeout):
        for gpu in gpus:
            kept = state.compute_mode_file(settings, env.node, gpu.uuid)
            held = _read(kept)
            if held is None:
                found = get_mode(gpu.uuid, settings.gpu_inventory)
                if found == EXCLUSIVE:
                    continue  # the admin's own: nothing of ours to put back
                held = (found, [])
            write_job_file(kept, "\n".join([held[0], *held[1], job]) + "\n", 0, 0)
            set_mode(gpu.uuid, EXCLUSIVE, settings.gpu_inventory)
            log.info("GPU %s: compute mode %s (was %s)", gpu.uuid, EXCLUSIVE, held[0])


def restore_modes(env: JobEnv, settings: Settings, job: str) -> int:
    """This job off every kept file of the node; the mode found back where no job holds the
    GPU and no other job has a daemon on it. How many GPUs could not be restored."""
    prefix = f"compute-mode.{validate_name('node name', env.node)}."
    try:  # root's own files: only below directories no one else can change
        check_dirs(Path(settings.run_dir), ROOT_ONLY)
        names = list_dir(Path(settings.run_dir), "cannot read run_dir") or []
    except LayoutError as exc:
        log.warning("compute modes: none read: %s", exc.line())
        return 0
    uuids = sorted(n[len(prefix) :] for n in names if n.startswith(prefix))
    if not uuids:
        return 0
    failed = 0
    with file_lock(state.compute_mode_lock(settings, env.node), settings.start_timeout):
        for uuid in uuids:
            try:
                _release(env, settings, job, uuid)
            except (MpswrapError, OSError) as exc:
                log.error("GPU %s: compute mode not restored: %s", uuid, exc)
                failed += 1
    return failed


def _release(env: JobEnv, settings: Settings, job: str, uuid: str) -> None:
    kept = state.compute_mode_file(settings, env.node, uuid)
    held = _read(kept)
    if held is None:
        return
    mode, holders = held[0], [j for j in held[1] if j != job]
    if holders or _used_elsewhere(settings, env.node, job, uuid):
        if holders != held[1]:
            write_job_file(kept, "\n".join([mode, *holders]) + "\n", 0, 0)
        log.info("GPU %s: left %s, another job holds it", uuid, EXCLUSIVE)
        return
    set_mode(uuid, mode, settings.gpu_inventory)
    kept.unlink()
    log.info("GPU %s: compute mode %s again", uuid, mode)


def _used_elsewhere(settings: Settings, node: str, job: str, uuid: str) -> bool:
    """Whether root started a daemon on ``uuid`` for another job of the node (root's records,
    never a manifest a job user could write)."""
    for layout in state.jobs_on_node(settings, node, None):
        if layout.job_id == job:
            continue
        if any(u.lower() == uuid.lower() for u in JobDaemons(layout, settings).uuids()):
            return True
    return False
