"""The node's NVML inventory, kept for the boot: root's hooks read one small file, not NVML.

NVML was the slowest step of a prolog after Python's own start: importing pynvml, ``nvmlInit``
and the per-GPU queries took about 50 ms on the H100 host (docs/gpu-results/2026-11-24). What
mpswrap takes from it (GPUs, minor numbers, CPU affinity, compute capability, memory, driver)
stays as it is until the machine reboots or an admin resets a GPU into another mode. So the
prolog writes it to ``<run_dir>/inventory.<node>.json`` after asking NVML, and root's hooks read
it while the kernel's own account of the GPUs is the one it was written with: the boot id, the
driver's version line, and each GPU's ``/proc/driver/nvidia/gpus/*/information`` (UUID, minor
number, bus location), whose GPUs must be the file's GPUs, one for one.

Only the hooks that slurmd runs as root use it: they run outside the job's cgroup and see every
GPU of the node, as the file does. A rank, a task prolog or a user-mode command asks NVML for
its own view, which a job's device cgroup may narrow and renumber. A file that is missing,
stale, not root's below directories only root can change, or a kernel without those ``/proc``
files (some containers) means NVML, as without the cache. After changing a GPU's MIG or ECC
mode with a reset instead of a reboot, remove the file (or set ``inventory_cache = no``).
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

from ..errors import LayoutError
from ..paths import ROOT_ONLY, open_dir, write_job_file

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = ["fingerprint", "read", "write"]

log = logging.getLogger(__name__)

PROC = Path("/proc")
LIMIT = 256 * 1024  # bytes: a node's inventory with its fingerprint is a few KiB per GPU
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


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
    """The kept inventory (its JSON) when root wrote it for ``now``; else None."""
    if now is None:
        return None
    text = _root_file(path)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        log.warning("not reading %s: not JSON", path)
        return None
    if not isinstance(data, dict) or data.get("fingerprint") != now or not _same_gpus(data):
        log.debug("%s was written for other GPUs, driver or boot: asking NVML", path)
        return None
    return data


def write(path: Path, now: dict[str, Any] | None, inventory: dict[str, Any]) -> None:
    """Keep ``inventory`` for the boot (root; an existing run_dir only root can change; NVML's
    GPUs the same as the kernel's). Never fails the caller."""
    if now is None or os.geteuid() != 0:
        return
    if not _same_gpus({"fingerprint": now, **inventory}):
        log.debug("NVML lists other GPUs than /proc/driver/nvidia: inventory not kept")
        return
    try:
        os.close(_root_dir(path.parent))
        write_job_file(path, json.dumps({"fingerprint": now, **inventory}), 0, 0, 0o644)
    except (LayoutError, OSError) as exc:
        log.debug("GPU inventory not kept: %s", exc)


def _same_gpus(data: dict[str, Any]) -> bool:
    """The inventory's GPUs (UUID, minor number) are the fingerprint's, one for one."""
    try:
        listed = {(str(g["uuid"]), int(g["minor"])) for g in data["gpus"]}
        kernel = {
            (_field(t, "GPU UUID"), int(_field(t, "Device Minor")))
            for t in data["fingerprint"]["gpus"].values()
        }
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    return listed == kernel and len(listed) == len(data["gpus"])


def _field(text: str, name: str) -> str:
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    raise KeyError(name)


def _root_dir(path: Path) -> int:
    """A descriptor of ``path``: every level from / root's and writable by no one else (no
    sticky exception for ``path`` itself). Raises LayoutError or OSError."""
    fd = open_dir(path, ROOT_ONLY)
    if os.fstat(fd).st_mode & 0o022:
        os.close(fd)
        raise LayoutError("directory is open to other users", thing=str(path))
    return fd


def _root_file(path: Path) -> str | None:
    """The text of root's regular file ``path`` of one link in a ``_root_dir``; else None."""
    try:
        parent = _root_dir(path.parent)
    except (LayoutError, OSError):
        return None
    try:
        fd = os.open(path.name, _READ, dir_fd=parent)
    except OSError:
        return None
    finally:
        os.close(parent)
    with open(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != 0:
            return None
        if st.st_size > LIMIT:
            return None
        return handle.read(LIMIT).decode(errors="replace")
