"""The node's NVML inventory, kept for the boot: hooks and ranks read one small file, not NVML.

NVML was the slowest step of a prolog after Python's own start, and every rank's supervisor
paid it again: importing pynvml, ``nvmlInit`` and the per-GPU queries took 50-90 ms on the
H100 host (docs/gpu-results/2026-11-24). What mpswrap takes from it (GPUs, minor numbers, CPU
affinity, compute capability, memory, driver) does not change while the machine runs. So
root's hooks write it to ``<run_dir>/inventory.<node>.json`` after asking NVML, and every
mpswrap process of the node reads it while the kernel's own account of the GPUs is the one it
was written with: the boot id, the driver's version line, and each GPU's
``/proc/driver/nvidia/gpus/*/information`` (UUID, minor number, bus location). A file that is
missing, stale, below a directory that anyone but root can change, or a kernel without those
``/proc`` files (e.g. some containers) means NVML, as without the cache. Only root writes it;
``inventory_cache = no`` turns it off.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from ..errors import LayoutError
from ..paths import check_dirs, read_job_file, write_job_file

__all__ = ["fingerprint", "read", "write"]

log = logging.getLogger(__name__)

PROC = Path("/proc")
LIMIT = 256 * 1024  # bytes: a node's inventory with its fingerprint is a few KiB per GPU
ROOT_ONLY = frozenset({0})


def fingerprint(proc: Path | None = None) -> dict[str, Any] | None:
    """The kernel's account of the GPUs now; None where it cannot be read (no cache then)."""
    proc = proc or PROC
    gpus_dir = proc / "driver" / "nvidia" / "gpus"
    try:
        boot = (proc / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
        driver = (proc / "driver" / "nvidia" / "version").read_text().partition("\n")[0]
        gpus = {bus: (gpus_dir / bus / "information").read_text() for bus in os.listdir(gpus_dir)}
    except OSError:
        return None
    return {"boot_id": boot, "driver": driver.strip(), "gpus": gpus} if gpus and boot else None


def read(path: Path, now: dict[str, Any] | None) -> dict[str, Any] | None:
    """The kept inventory (its JSON) when it was written for ``now``; else None."""
    if now is None or not _roots(path):
        return None
    text = read_job_file(path, LIMIT)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        log.warning("not reading %s: not JSON", path)
        return None
    if not isinstance(data, dict) or data.get("fingerprint") != now:
        log.debug("%s was written for other GPUs, driver or boot: asking NVML", path)
        return None
    return data


def write(path: Path, now: dict[str, Any] | None, inventory: dict[str, Any]) -> None:
    """Keep ``inventory`` for the boot (root; an existing run_dir). Never fails the caller."""
    if now is None or os.geteuid() != 0 or not _roots(path):
        return
    try:
        write_job_file(path, json.dumps({"fingerprint": now, **inventory}), 0, 0, 0o644)
    except (LayoutError, OSError) as exc:
        log.debug("GPU inventory not kept: %s", exc)


def _roots(path: Path) -> bool:
    """Every directory down to ``path``'s is there and only root can change it (no sticky
    exception for the last one): what is found there was written by root."""
    try:
        check_dirs(path.parent, ROOT_ONLY)
        return not os.stat(path.parent).st_mode & 0o022
    except (LayoutError, OSError):
        return False
