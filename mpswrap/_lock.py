"""File locks between processes of a node: the one owner of filelock.

filelock is imported when a lock is first made, not with mpswrap: with what it brings
(secrets, hashlib, decimal, platform, threading) it cost every per-rank supervisor 4.6 MiB
and some milliseconds (docs/benchmarks.md), and a rank that joins the prolog's daemons never
takes a lock. Acquiring one past its timeout raises ``TimeoutError``
(filelock's ``Timeout`` is one).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    from filelock import FileLock as FileLock  # noqa: PLC0414 - re-exported for typing

__all__ = ["file_lock"]


def file_lock(path: Path, timeout: float) -> FileLock:
    """A lock on ``path`` (created if missing), re-entrant within the object that holds it.

    Keep one object per path and process: two objects of one process on one path exclude
    each other like two processes would.
    """
    import filelock

    return filelock.FileLock(str(path), timeout=timeout)
