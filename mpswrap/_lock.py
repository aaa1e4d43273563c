"""File locks between processes of a node: the one owner of filelock.

filelock is imported when a lock is first made, not with mpswrap: with what it brings
(secrets, hashlib, decimal, platform, threading) it cost every per-rank supervisor 4.6 MiB
and some milliseconds (docs/benchmarks.md), and a rank that joins the prolog's daemons never
takes a lock. Acquiring one past its timeout raises ``TimeoutError``
(filelock's ``Timeout`` is one).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    from filelock import FileLock as FileLock  # noqa: PLC0414 - re-exported for typing

__all__ = ["file_lock", "maybe_locked"]

log = logging.getLogger(__name__)


def file_lock(path: Path, timeout: float) -> FileLock:
    """A lock on ``path`` (created if missing), re-entrant within the object that holds it.

    Keep one object per path and process: two objects of one process on one path exclude
    each other like two processes would.
    """
    import filelock

    return filelock.FileLock(str(path), timeout=timeout)


@contextmanager
def maybe_locked(path: Path | None, timeout: float) -> Iterator[None]:
    """Hold the lock on ``path`` if it can be had within ``timeout``; else go on without it.

    For locks that only space out work (control commands of many ranks' ladders): such work
    must never fail for want of the lock.
    """
    if path is None:
        yield
        return
    held = file_lock(path, timeout=timeout)
    try:
        held.acquire()
    except TimeoutError:
        log.warning("%s busy for %g s: going on without it", path, timeout)
        yield
        return
    except OSError as exc:
        log.warning("cannot take %s (%s): going on without it", path, exc.strerror or exc)
        yield
        return
    try:
        yield
    finally:
        held.release()
