"""GPU inventory: the only module that imports pynvml.

Two sources behind one interface: NVML (the real driver, initialised on first use; or its
answer kept for the boot, ``inventory_cache``) and a JSON file (the simulator's fake
inventory). GPU lists given as NVML indices or UUIDs are resolved here; Slurm's names for GPUs
in ``slurm.gpus``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._struct import Struct, asdict
from ..errors import GpuChoiceError, GpuError, InventoryFileError, LayoutError
from ..jobenv import UUID_RE, parse_int_list
from ..paths import list_dir, read_job_file
from . import inventory_cache

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = [
    "GpuInfo",
    "Inventory",
    "client_limit",
    "health_problem",
    "load_inventory",
    "resolve_gpus",
    "usage",
]

log = logging.getLogger(__name__)


class GpuInfo(Struct, frozen=True):
    index: int
    uuid: str
    minor: int
    name: str
    compute_capability: tuple[int, int]
    cpus: frozenset[int]
    numa_node: int | None = None
    mig: bool = False
    memory_total: int = 0
    pci_bus_id: str = ""

    def to_json(self) -> dict[str, Any]:
        cc, cpus = list(self.compute_capability), sorted(self.cpus)
        return {**asdict(self), "compute_capability": cc, "cpus": cpus}

    @classmethod
    def group(cls, gpus: Sequence[GpuInfo]) -> GpuInfo:
        """Several GPUs that one daemon serves together, for ranks that use them all (a
        rank of ``--gpus-per-rank N``): the UUIDs joined by commas are what the daemon's
        and its clients' ``CUDA_VISIBLE_DEVICES`` name; the CPUs near any of them; the
        oldest architecture (the client limit); the least memory of one of them."""
        if len(gpus) == 1:
            return gpus[0]
        return cls(
            index=gpus[0].index,
            uuid=",".join(g.uuid for g in gpus),
            minor=gpus[0].minor,
            name=gpus[0].name,
            compute_capability=min(g.compute_capability for g in gpus),
            cpus=frozenset().union(*(g.cpus for g in gpus)),
            numa_node=gpus[0].numa_node,
            mig=any(g.mig for g in gpus),
            memory_total=min(g.memory_total for g in gpus),
            pci_bus_id=",".join(g.pci_bus_id for g in gpus),
        )


class Inventory(Struct):
    """The node's GPUs in NVML index order, plus driver facts."""

    gpus: list[GpuInfo]
    driver_version: str = ""
    cuda_driver_version: int = 0
    source: str = "nvml"
    _nvml: Any = None

    def by_uuid(self, uuid: str) -> GpuInfo:
        """The GPU of ``uuid``; for UUIDs joined by commas, their group (``GpuInfo.group``)."""
        if "," in uuid:
            return GpuInfo.group([self.by_uuid(u) for u in uuid.split(",")])
        for gpu in self.gpus:
            if gpu.uuid.lower() == uuid.lower():
                return gpu
        raise GpuChoiceError(
            "no such GPU",
            thing=uuid,
            cause=f"not among {len(self.gpus)} GPUs",
            hint="list GPUs with: nvidia-smi -L",
        )

    def by_index(self, index: int) -> GpuInfo:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise GpuChoiceError(
            "no such GPU",
            thing=f"index {index}",
            cause=f"this node has {len(self.gpus)} GPU(s)",
            hint="list GPUs with: nvidia-smi -L",
        )

    def by_minor(self, minor: int) -> GpuInfo:
        for gpu in self.gpus:
            if gpu.minor == minor:
                return gpu
        raise GpuError(
            "no GPU with that device minor number",
            thing=f"/dev/nvidia{minor}",
            cause="gres.conf names a device NVML does not list",
        )

    def to_json(self) -> dict[str, Any]:
        gpus = [gpu.to_json() for gpu in self.gpus]
        return {
            "driver_version": self.driver_version,
            "gpus": gpus,
            "cuda_driver_version": self.cuda_driver_version,
        }

    def compute_pids(self, uuid: str) -> list[int]:
        """PIDs NVML lists as compute processes of that GPU (empty for a file inventory).
        NVML is initialised here when the inventory came from the boot's file."""
        if self.source != "nvml":
            return []
        if self._nvml is None:
            self._nvml = init_nvml()
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        return [int(p.pid) for p in procs]


def _cpu_set(value: Any) -> frozenset[int]:
    if isinstance(value, str):
        return frozenset(parse_int_list(value, "cpu list"))
    return frozenset(int(v) for v in value)


def _from_file(path: str) -> Inventory:
    """The inventory the ``gpu_inventory`` setting names: a file it cannot read is a bad
    value of that setting (exit 2), as a missing admin file is."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise _unreadable(path, exc.strerror or str(exc)) from exc
    except json.JSONDecodeError as exc:
        raise _unreadable(path, f"not JSON (line {exc.lineno} column {exc.colno})") from exc
    except ValueError as exc:  # not UTF-8
        raise _unreadable(path, "not UTF-8 text") from exc
    try:
        return inventory_from_json(data, path)
    except GpuError as exc:
        raise _unreadable(path, f"not an inventory: {exc.cause}") from exc


def _unreadable(path: str, cause: str) -> InventoryFileError:
    return InventoryFileError("cannot read GPU inventory file", thing=path, cause=cause)


def inventory_from_json(data: Any, source: str) -> Inventory:
    """An inventory from its JSON form (``Inventory.to_json``; the simulator's files); a
    GpuError says what is wrong in words, not in Python's."""
    listed = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(listed, list) or not all(isinstance(g, dict) for g in listed):
        raise GpuError(
            "cannot read GPU inventory file",
            thing=source,
            cause='expected an object whose "gpus" is a list of GPUs (as mpswrap sim inventory '
            "writes)",
        )
    try:
        gpus = [
            GpuInfo(
                index=int(g["index"]),
                uuid=str(g["uuid"]),
                minor=int(g["minor"]),
                name=str(g.get("name", "GPU")),
                compute_capability=(
                    int(g["compute_capability"][0]),
                    int(g["compute_capability"][1]),
                ),
                cpus=_cpu_set(g.get("cpus", [])),
                numa_node=g.get("numa_node"),
                mig=bool(g.get("mig", False)),
                memory_total=int(g.get("memory_total", 0)),
                pci_bus_id=str(g.get("pci_bus_id", "")),
            )
            for g in listed
        ]
        driver, cuda = str(data.get("driver_version", "")), int(data.get("cuda_driver_version", 0))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError) as exc:
        cause = (
            f"a GPU has no field {exc}"
            if isinstance(exc, KeyError)
            else "a field has a value of the wrong type or out of range"
        )
        raise GpuError("cannot read GPU inventory file", thing=source, cause=cause) from exc
    return Inventory(gpus, driver, cuda, source=source)


def _mask_to_cpus(words: Sequence[int]) -> frozenset[int]:
    bits = ((i, bit) for i, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1)
    return frozenset(i * 64 + bit for i, bit in bits)


def _nvml_gpu(nvml: Any, index: int) -> GpuInfo:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    uuid = nvml.nvmlDeviceGetUUID(handle)
    name = nvml.nvmlDeviceGetName(handle)
    words = max(1, ((os.cpu_count() or 1) + 63) // 64)
    try:
        cpus = _mask_to_cpus(nvml.nvmlDeviceGetCpuAffinity(handle, words))
    except nvml.NVMLError:
        cpus = frozenset()
    try:
        mig = bool(nvml.nvmlDeviceGetMigMode(handle)[0])
    except nvml.NVMLError:
        mig = False
    try:
        numa: int | None = int(nvml.nvmlDeviceGetNumaNodeId(handle))
    except (nvml.NVMLError, AttributeError):
        numa = None
    return GpuInfo(
        index=index,
        uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
        minor=int(nvml.nvmlDeviceGetMinorNumber(handle)),
        name=name.decode() if isinstance(name, bytes) else str(name),
        compute_capability=tuple(nvml.nvmlDeviceGetCudaComputeCapability(handle)),
        cpus=cpus,
        numa_node=numa,
        mig=mig,
        memory_total=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
        pci_bus_id=str(nvml.nvmlDeviceGetPciInfo(handle).busId),
    )


def init_nvml() -> Any:
    """pynvml, imported and initialised."""
    try:
        import pynvml as nvml
    except ImportError as exc:
        raise GpuError(
            "cannot load NVML bindings",
            thing="pynvml",
            cause=str(exc),
            hint="pip install nvidia-ml-py",
        ) from exc
    began = time.monotonic()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise nvml_failed("nvmlInit", exc) from exc
    log.debug("NVML started in %.0f ms", (time.monotonic() - began) * 1000)
    return nvml


def nvml_failed(what: str, exc: Exception) -> GpuError:
    return GpuError(
        "NVML failed",
        thing=what,
        cause=str(exc),
        hint="is the NVIDIA driver loaded? run nvidia-smi",
    )


def _from_nvml() -> Inventory:
    nvml = init_nvml()
    try:
        count = nvml.nvmlDeviceGetCount()
        gpus = [_nvml_gpu(nvml, i) for i in range(count)]
        driver = nvml.nvmlSystemGetDriverVersion()
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
    except nvml.NVMLError as exc:
        raise nvml_failed("device query", exc) from exc
    driver = driver.decode() if isinstance(driver, bytes) else str(driver)
    return Inventory(gpus, driver, cuda, source="nvml", _nvml=nvml)


_CACHE: dict[str, Inventory] = {}


def load_inventory(source: str = "nvml", kept: Path | None = None) -> Inventory:
    """The node's inventory from NVML or from a JSON file; loaded once per process.

    ``kept``: the boot's inventory file (``inventory_cache``), read instead of NVML while the
    kernel's account of the GPUs is the one it was written with; written after NVML (root).
    """
    if source not in _CACHE:
        _CACHE[source] = _from_file(source) if source != "nvml" else _nvml_or_kept(kept)
    return _CACHE[source]


def _nvml_or_kept(kept: Path | None) -> Inventory:
    if kept is None:
        return _from_nvml()
    now = inventory_cache.fingerprint()
    data = inventory_cache.read(kept, now)
    if data is not None:
        try:
            return inventory_from_json(data, "nvml")
        except GpuError as exc:
            log.warning("%s: asking NVML", exc.line())
    inventory = _from_nvml()
    inventory_cache.write(kept, now, inventory.to_json())
    return inventory


# --- resolution -----------------------------------------------------------------------
def check_uuid(text: str) -> str:
    if not UUID_RE.fullmatch(text):
        raise GpuChoiceError(
            "malformed GPU UUID",
            thing=repr(text),
            cause="expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
        )
    return text


def resolve_gpus(spec: str, inventory: Inventory) -> list[GpuInfo]:
    """Resolve ``all``, or a comma list of NVML indices (``0,2-3``) and/or UUIDs."""
    spec = spec.strip()
    if spec in ("", "all"):
        if not inventory.gpus:
            raise GpuError("no GPUs found", thing=inventory.source)
        return list(inventory.gpus)
    out: list[GpuInfo] = []
    for item in (s.strip() for s in spec.split(",")):
        if item.upper().startswith(("GPU-", "MIG-")):
            out.append(inventory.by_uuid(check_uuid(item)))
        else:
            out.extend(inventory.by_index(i) for i in parse_int_list(item, "GPU list"))
    if len({g.uuid for g in out}) != len(out):
        raise GpuChoiceError("GPU listed twice", thing=spec, hint="name each GPU once")
    return out


def usage(uuid: str, source: str) -> dict[str, Any] | None:
    """What NVML says the GPU is using now: memory used and total, utilisation, and the GPU
    memory of each process it lists (MPS clients through the MPS-aware query where the driver
    has it). Each figure on its own (None where NVML cannot give it, e.g. utilisation on MIG);
    None where NVML does not answer at all. A file inventory gives the same figures from its
    memory folder (``MEMORY_DIR_SUFFIX``)."""
    if source != "nvml":
        return _file_usage(uuid, source)
    began = time.monotonic()
    try:
        nvml = init_nvml()
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception as exc:  # GpuError, or NVML's own error types
        log.debug("no NVML figures for %s: %s", uuid, exc)
        return None
    memory = _asked(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    util = _asked(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    figures = (time.monotonic() - began) * 1000
    processes: dict[int, int] = {}
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
        query = getattr(nvml, name, None)  # the MPS view last: it wins
        for proc in (_asked(lambda q=query: q(handle)) or []) if query else []:
            if getattr(proc, "usedGpuMemory", None) is not None:
                processes[int(proc.pid)] = int(proc.usedGpuMemory)
    log.debug(
        "NVML figures of %s: memory and utilisation in %.0f ms, %d processes in %.0f ms",
        uuid,
        figures,
        len(processes),
        (time.monotonic() - began) * 1000 - figures,
    )
    return {
        "memory_used_bytes": int(memory.used) if memory else None,
        "memory_total_bytes": int(memory.total) if memory else None,
        "utilization_percent": int(util.gpu) if util else None,
        "processes": processes,
    }


#: A file inventory's memory figures: a directory beside the file (``<FILE>.mem``), one folder
#: per GPU UUID, one entry per process that holds memory there, named by its PID, holding
#: ``<bytes> <start>`` (``<start>``: field 22 of ``/proc/<PID>/stat``, so that an entry whose
#: process is gone, or whose PID was reused, counts for nothing, as the driver frees the memory
#: of a process that exits). The simulator's clients write it (``sim.memory``); the processes
#: of every user write there, so each entry is read as hostile input: no link, a few bytes.
MEMORY_DIR_SUFFIX = ".mem"
ENTRY_LIMIT = 64
#: Entries of one GPU read at most (a GPU has at most 60 MPS clients per server).
ENTRIES_LIMIT = 4096


def _file_usage(uuid: str, source: str) -> dict[str, Any] | None:
    """A file inventory's GPU as NVML would give it: its ``memory_total`` and the memory its
    entries hold (above); None for a file that is not there or a GPU it does not list."""
    try:
        gpu = load_inventory(source).by_uuid(uuid)
    except GpuError:
        return None
    held = _file_held(Path(f"{source}{MEMORY_DIR_SUFFIX}") / uuid)
    return {
        "memory_used_bytes": sum(held.values()),
        "memory_total_bytes": gpu.memory_total or None,
        "utilization_percent": None,
        "processes": held,
    }


def _file_held(folder: Path) -> dict[int, int]:
    """PID -> bytes of the live processes a GPU's memory folder names."""
    try:
        names = list_dir(folder) or []
    except LayoutError:
        return {}
    held: dict[int, int] = {}
    for name in [n for n in names if n.isdigit() and len(n) < 11][:ENTRIES_LIMIT]:
        words = (read_job_file(folder / name, ENTRY_LIMIT) or "").split()
        if len(words) == 2 and words[0].isdigit() and _started(int(name)) == words[1]:
            held[int(name)] = int(words[0])
    return held


def _started(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (its start, in clock ticks after boot); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
        return data[data.rindex(b")") + 2 :].split()[19].decode()
    except (OSError, ValueError, IndexError):
        return None


def _asked(query: Any) -> Any:
    """NVML's answer, or None where it has none (not supported, an older driver)."""
    try:
        return query()
    except Exception as exc:  # NVML's own error types
        log.debug("NVML: %s", exc)
        return None


def health_problem(uuid: str, source: str) -> str | None:
    """After teardown: is the GPU still listed, with no compute process left? (None = fine)."""
    _CACHE.pop(source, None)  # a fresh look, not the prolog's cached inventory
    try:
        inventory = load_inventory(source)
        inventory.by_uuid(uuid)
        left = inventory.compute_pids(uuid)
    except GpuError as exc:
        return exc.line()
    except Exception as exc:  # NVML raises its own error types
        return f"NVML query failed: {exc}"
    return f"compute processes still on the GPU: {left}" if left else None


# --- capacity ---------------------------------------------------------------------------
def client_limit(
    gpu: GpuInfo, cuda_driver_version: int, env: Mapping[str, str], configured: Any = "auto"
) -> int:
    """MPS clients one server accepts on ``gpu``.

    16 before Volta; 48 on Volta and later (seen on an H100, CUDA 13.0); 60 from CUDA 13.1
    (NVIDIA's documentation; not yet seen). A larger ``CUDA_DEVICE_MAX_CONNECTIONS`` than the
    MPS default of 2 lowers it in proportion. MIG compute instances lower it further; the
    inventory cannot see instance sizes, so MIG GPUs need ``client_limit`` set by the admin.
    """
    if configured != "auto":
        return int(configured)
    if gpu.compute_capability[0] < 7:
        limit = 16
    elif cuda_driver_version >= 13010:
        limit = 60
    else:
        limit = 48
    try:
        connections = int(env.get("CUDA_DEVICE_MAX_CONNECTIONS", "2"))
    except ValueError:
        connections = 2
    if connections > 2:
        limit = max(1, limit * 2 // connections)
    return limit
