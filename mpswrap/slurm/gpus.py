"""Slurm's names for a job's GPUs, resolved to NVML devices: gres positions through gres.conf
``File=`` and each device's minor number (gres.conf order and NVML order can differ on real
nodes), UUIDs, ``CUDA_VISIBLE_DEVICES``; and the GPUs one step may use.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError, GpuChoiceError, GpuError
from ..jobenv import GpuRef, JobEnv
from ..mps.gpu import GpuInfo, Inventory, resolve_gpus

__all__ = [
    "default_gres_conf",
    "expand_hostlist",
    "gres_minors",
    "in_hostlist",
    "resolve_gres_positions",
    "resolve_slurm_gpus",
    "visible_gpus",
]


#: Names one hostlist may stand for: Slurm's own bound on a range (``MAX_RANGE`` of its
#: hostlist.c, 64K). A forged ``Nodes=zz[0-999999999999]`` is refused, never expanded.
HOSTLIST_LIMIT = 64 * 1024
_RANGE = re.compile(r"([0-9]{1,18})(?:-([0-9]{1,18}))?")
Part = tuple[str, list[tuple[int, int, int]], str]


def expand_hostlist(text: str) -> list[str]:
    """Expand ``node[1-3,5],gpu7`` (enough of Slurm's hostlist syntax for gres.conf), at most
    ``HOSTLIST_LIMIT`` names (a GpuError past it)."""
    names: list[str] = []
    for head, ranges, tail in _parts(text):
        for first, last, width in ranges:
            if len(names) + last - first >= HOSTLIST_LIMIT:
                raise GpuError("hostlist larger than Slurm allows", thing=_quoted(text))
            names += [f"{head}{n:0{width}d}{tail}" for n in range(first, last + 1)]
        if not ranges:
            names.append(head)
    return names


def in_hostlist(name: str, text: str) -> bool:
    """Whether ``text`` (a hostlist) names ``name``, without expanding it: a GpuError where
    ``expand_hostlist`` would raise one for a range."""
    for head, ranges, tail in _parts(text):
        if not ranges:
            if name == head:
                return True
            continue
        middle = name[len(head) : len(name) - len(tail)] if len(name) > len(head + tail) else ""
        if not (name.startswith(head) and name.endswith(tail) and _RANGE.fullmatch(middle)):
            continue
        number = int(middle)
        if any(f <= number <= la and f"{number:0{w}d}" == middle for f, la, w in ranges):
            return True
    return False


def _parts(text: str) -> list[Part]:
    """Each ``head[ranges]tail`` of a hostlist (a plain name: no ranges), each range as
    (first, last, width) and none larger than Slurm allows."""
    parts: list[Part] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text):
        match = re.match(r"^(.*)\[([^\]]*)\](.*)$", part)
        if not match:
            parts.append((part, [], ""))
            continue
        head, body, tail = match.groups()
        ranges = []
        for item in body.split(","):
            bounds = _RANGE.fullmatch(item)
            if not bounds:
                raise GpuError("malformed hostlist", thing=_quoted(text))
            lo, hi = bounds.group(1), bounds.group(2) or bounds.group(1)
            first, last = int(lo), int(hi)
            if last - first >= HOSTLIST_LIMIT:
                raise GpuError("hostlist range larger than Slurm allows", thing=_quoted(text))
            ranges.append((first, last, len(lo)))
        parts.append((head, ranges, tail))
    return parts


def _quoted(text: str) -> str:
    return repr(text[:200])


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
        if "NodeName" in fields and node not in expand_hostlist(fields["NodeName"]):
            continue
        for path in expand_hostlist(fields["File"]):
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


def visible_gpus(env: JobEnv, inventory: Inventory) -> list[GpuInfo]:
    """The GPUs this step may use: Slurm's gres positions, else CUDA_VISIBLE_DEVICES, else all."""
    refs = env.step_gpus
    if refs:
        return resolve_gres_positions(refs, inventory, default_gres_conf(env.env), env.node)
    cvd = env.env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() in ("", "-1", "NoDevFiles"):
        raise GpuChoiceError(
            "CUDA_VISIBLE_DEVICES hides every GPU",
            thing=repr(cvd),
            hint="unset CUDA_VISIBLE_DEVICES, or give --gpus",
        )
    try:
        return resolve_gpus(cvd or "all", inventory)
    except (GpuChoiceError, ConfigError) as exc:  # a bad value of the variable: name it
        if cvd:
            exc.with_context("CUDA_VISIBLE_DEVICES")
        raise
