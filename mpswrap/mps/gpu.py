"""GPU inventory: the only module that imports pynvml.

Two sources behind one interface: NVML (the real driver, initialised on first use) and a JSON
file (the simulator's fake inventory). GPU lists given as NVML indices, UUIDs, or Slurm gres
positions are resolved here; gres positions go through gres.conf ``File=`` and the device's
minor number, because gres.conf order and NVML order can differ on real nodes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import GpuError
from ..jobenv import UUID_RE, GpuRef, JobEnv, parse_int_list

__all__ = [
    "GpuInfo",
    "Inventory",
    "client_limit",
    "gres_minors",
    "load_inventory",
    "resolve_gpus",
    "resolve_gres_positions",
    "resolve_slurm_gpus",
    "visible_gpus",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
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
        return {**dataclasses.asdict(self), "compute_capability": cc, "cpus": cpus}


@dataclass
class Inventory:
    """The node's GPUs in NVML index order, plus driver facts."""

    gpus: list[GpuInfo]
    driver_version: str = ""
    cuda_driver_version: int = 0
    source: str = "nvml"
    _nvml: Any = field(default=None, repr=False)

    def by_uuid(self, uuid: str) -> GpuInfo:
        for gpu in self.gpus:
            if gpu.uuid.lower() == uuid.lower():
                return gpu
        raise GpuError(
            "no such GPU",
            thing=uuid,
            cause=f"not among {len(self.gpus)} GPUs",
            hint="list GPUs with: nvidia-smi -L",
        )

    def by_index(self, index: int) -> GpuInfo:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise GpuError(
            "no such GPU", thing=f"index {index}", cause=f"this node has {len(self.gpus)} GPU(s)"
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

    def compute_pids(self, uuid: str) -> list[int]:
        """PIDs NVML lists as compute processes of that GPU (empty for a file inventory)."""
        if self._nvml is None:
            return []
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        return [int(p.pid) for p in procs]


def _cpu_set(value: Any) -> frozenset[int]:
    if isinstance(value, str):
        return frozenset(parse_int_list(value, "cpu list"))
    return frozenset(int(v) for v in value)


def _from_file(path: str) -> Inventory:
    try:
        data = json.loads(Path(path).read_text())
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
            for g in data["gpus"]
        ]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise GpuError("cannot read GPU inventory file", thing=path, cause=str(exc)) from exc
    return Inventory(
        gpus,
        str(data.get("driver_version", "")),
        int(data.get("cuda_driver_version", 0)),
        source=path,
    )


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


def _from_nvml() -> Inventory:
    try:
        import pynvml as nvml
    except ImportError as exc:
        raise GpuError(
            "cannot load NVML bindings",
            thing="pynvml",
            cause=str(exc),
            hint="pip install nvidia-ml-py",
        ) from exc
    try:
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        gpus = [_nvml_gpu(nvml, i) for i in range(count)]
        driver = nvml.nvmlSystemGetDriverVersion()
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
    except nvml.NVMLError as exc:
        raise GpuError(
            "NVML failed",
            thing="nvmlInit/device query",
            cause=str(exc),
            hint="is the NVIDIA driver loaded? run nvidia-smi",
        ) from exc
    driver = driver.decode() if isinstance(driver, bytes) else str(driver)
    return Inventory(gpus, driver, cuda, source="nvml", _nvml=nvml)


_CACHE: dict[str, Inventory] = {}


def load_inventory(source: str = "nvml") -> Inventory:
    """The node's inventory from NVML or from a JSON file; loaded once per process."""
    if source not in _CACHE:
        _CACHE[source] = _from_nvml() if source == "nvml" else _from_file(source)
    return _CACHE[source]


# --- resolution -----------------------------------------------------------------------
def check_uuid(text: str) -> str:
    if not UUID_RE.fullmatch(text):
        raise GpuError(
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
        raise GpuError("GPU listed twice", thing=spec)
    return out


def _expand_hostlist(text: str) -> list[str]:
    """Expand ``node[1-3,5],gpu7`` (enough of Slurm's hostlist syntax for gres.conf)."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text):
        match = re.match(r"^(.*)\[([^\]]*)\](.*)$", part)
        if not match:
            names.append(part)
            continue
        head, body, tail = match.groups()
        for item in body.split(","):
            lo, _, hi = item.partition("-")
            width = len(lo)
            try:
                first, last = int(lo), int(hi or lo)
            except ValueError:
                raise GpuError("malformed hostlist in gres.conf", thing=repr(text)) from None
            for n in range(first, last + 1):
                names.append(f"{head}{n:0{width}d}{tail}")
    return names


def gres_minors(gres_conf: Path, node: str) -> list[int]:
    """Device minor numbers of this node's ``Name=gpu`` entries, in gres.conf order."""
    try:
        text = gres_conf.read_text()
    except OSError as exc:
        raise GpuError(
            "cannot read gres.conf",
            thing=str(gres_conf),
            cause=exc.strerror,
            hint="check SLURM_CONF: gres.conf is read from its directory",
        ) from exc
    minors: list[int] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if fields.get("Name") != "gpu" or "File" not in fields:
            continue
        if "NodeName" in fields and node not in _expand_hostlist(fields["NodeName"]):
            continue
        for path in _expand_hostlist(fields["File"]):
            minors.append(_device_minor(path))
    return minors


def _device_minor(path: str) -> int:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise GpuError("cannot stat GPU device", thing=path, cause=exc.strerror) from exc
    if not stat.S_ISCHR(st.st_mode):
        raise GpuError("gres.conf File= is not a character device", thing=path)
    return os.minor(st.st_rdev)


def resolve_slurm_gpus(
    refs: Sequence[GpuRef], inventory: Inventory, gres_conf: Path | None, node: str
) -> list[tuple[int, GpuInfo]]:
    """Slurm's GPUs as (gres position, GPU), each GPU once: a position goes gres.conf File= →
    minor number → NVML device; a UUID is looked up, and its position found the same way.

    Without gres.conf ``File=`` lines (e.g. AutoDetect), positions follow minor-number order.
    """
    minors = gres_minors(gres_conf, node) if gres_conf and gres_conf.exists() else []
    minors = minors or sorted(g.minor for g in inventory.gpus)
    out: dict[str, tuple[int, GpuInfo]] = {}
    for ref in refs:
        pos, gpu = _by_uuid(ref, inventory, minors) if isinstance(ref, str) else (ref, None)
        if pos >= len(minors):
            raise GpuError(
                "Slurm GPU position not in gres.conf",
                thing=f"position {pos}",
                cause=f"gres.conf lists {len(minors)} GPU(s) for {node}",
            )
        gpu = gpu or inventory.by_minor(minors[pos])
        out.setdefault(gpu.uuid, (pos, gpu))
    return list(out.values())


def _by_uuid(uuid: str, inventory: Inventory, minors: list[int]) -> tuple[int, GpuInfo]:
    if uuid.startswith("MIG-"):
        raise GpuError("MIG devices are not supported", thing=uuid, hint="give MPS jobs whole GPUs")
    gpu = inventory.by_uuid(uuid)
    if gpu.minor not in minors:
        cause = f"gres.conf lists no /dev/nvidia{gpu.minor}"
        raise GpuError("Slurm GPU not in gres.conf", thing=uuid, cause=cause)
    return minors.index(gpu.minor), gpu


def resolve_gres_positions(
    refs: Sequence[GpuRef], inventory: Inventory, gres_conf: Path | None, node: str
) -> list[GpuInfo]:
    """Slurm's GPUs (positions or UUIDs) as NVML devices, each once."""
    return [gpu for _, gpu in resolve_slurm_gpus(refs, inventory, gres_conf, node)]


def default_gres_conf(env: Mapping[str, str]) -> Path:
    conf = env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    return Path(conf).parent / "gres.conf"


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


def visible_gpus(env: JobEnv, inventory: Inventory) -> list[GpuInfo]:
    """The GPUs this step may use: Slurm's gres positions, else CUDA_VISIBLE_DEVICES, else all."""
    refs = env.step_gpus
    if refs:
        return resolve_gres_positions(refs, inventory, default_gres_conf(env.env), env.node)
    cvd = env.env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() in ("", "-1", "NoDevFiles"):
        raise GpuError("CUDA_VISIBLE_DEVICES hides every GPU", thing=repr(cvd))
    return resolve_gpus(cvd or "all", inventory)
