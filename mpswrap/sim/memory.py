"""The simulated GPUs' memory: the simulated client allocates (and fails as CUDA does when
its GPU has no room) in a ledger kept in the format a file inventory gives its GPUs' memory
in (``mps.gpu.MEMORY_DIR_SUFFIX``), so that mpswrap reads it as it reads NVML's figures,
without knowing the simulator (``mps.gpu.usage`` of a file inventory).

A GPU's memory is a ledger, the directory ``<inventory file>.mem/<GPU UUID>/``: one file per
client that holds memory, named by its PID, holding ``<bytes> <start time>``. The GPU's total
is the inventory's ``memory_total`` for that UUID (``inventory.MEMORY_TOTAL`` where the client
has no inventory). A client allocates under the GPU's lock: if the live clients' bytes and its
own exceed the total it gets no memory and fails with CUDA's error 2, "out of memory", as the
real client's ``cudaMalloc`` does. Memory is freed when its process exits, as the driver frees
it: an entry whose process is gone (or whose PID was reused) counts for nothing.

The client finds the inventory through ``MPSWRAP_GPU_INVENTORY``, the variable mpswrap reads
it from; without one, it holds nothing (the simulator then models no memory).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

from .inventory import MEMORY_TOTAL

__all__ = ["INVENTORY_VAR", "allocate", "ledger", "release", "usage"]

INVENTORY_VAR = "MPSWRAP_GPU_INVENTORY"


def ledger(inventory: str | os.PathLike[str], uuid: str) -> Path:
    """The directory of ``uuid``'s ledger, beside the inventory file."""
    return Path(f"{os.fspath(inventory)}.mem") / uuid


def _start_time(pid: int) -> str | None:
    """The process's start (clock ticks after boot, /proc/PID/stat field 22), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def _total(inventory: str | os.PathLike[str], uuid: str) -> int:
    try:
        data = json.loads(Path(inventory).read_text())
        gpu = next(g for g in data["gpus"] if str(g["uuid"]).lower() == uuid.lower())
        return int(gpu.get("memory_total") or MEMORY_TOTAL)
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return MEMORY_TOTAL


def _held(directory: Path) -> dict[int, int]:
    """PID -> bytes of the live clients of a ledger."""
    out: dict[int, int] = {}
    names = os.listdir(directory) if directory.is_dir() else []
    for name in (n for n in names if n.isdigit()):
        try:
            size, start = _small(directory / name).split()
        except (OSError, ValueError):
            continue
        if _start_time(int(name)) == start:
            out[int(name)] = int(size)
    return out


def _small(path: Path) -> str:
    """A ledger entry: a client of any user writes one, so no link, no FIFO, a few bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a file")
        return os.read(fd, 64).decode()
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # clients of every user share it, as they share a GPU
        directory.chmod(0o1777)
        directory.parent.chmod(0o1777)
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def usage(inventory: str | os.PathLike[str], uuid: str) -> tuple[int, int, dict[int, int]]:
    """(bytes used, total bytes, PID -> bytes of each client): what NVML would say."""
    held = _held(ledger(inventory, uuid))
    return sum(held.values()), _total(inventory, uuid), held


def allocate(env: Mapping[str, str], uuid: str, size: int) -> bool:
    """Hold ``size`` bytes on ``uuid`` for this process; False when the GPU has no room."""
    inventory = env.get(INVENTORY_VAR, "")
    start = _start_time(os.getpid())
    if size <= 0 or not inventory or inventory == "nvml" or start is None:
        return True
    directory = ledger(inventory, uuid)
    with _locked(directory):
        used, total, _ = usage(inventory, uuid)
        if used + size > total:
            return False
        path = directory / str(os.getpid())
        path.write_text(f"{size} {start}\n")
        with contextlib.suppress(OSError):
            path.chmod(0o644)
    return True


def release(env: Mapping[str, str], uuid: str) -> None:
    """This process's memory back (its exit frees it too: this only tidies the ledger)."""
    inventory = env.get(INVENTORY_VAR, "")
    if inventory and inventory != "nvml":
        with contextlib.suppress(OSError):
            (ledger(inventory, uuid) / str(os.getpid())).unlink()
