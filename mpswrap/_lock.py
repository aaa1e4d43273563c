"""File locks between processes of a node: the one owner of filelock.

filelock is imported when a lock is first made, not with mpswrap: with what it brings
(secrets, hashlib, decimal, platform, threading) it cost every per-rank supervisor 4.6 MiB
and some milliseconds (docs/benchmarks.md), and a rank that joins the prolog's daemons never
takes a lock. Its errors do not leave this module: a lock not had in time is ``LockTimeout``
(a ``TimeoutError``), a lock file that cannot be opened a ``LayoutError`` (an ``OSError``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import LayoutError, LockTimeout

__all__ = ["FileLock", "file_lock", "maybe_locked"]

log = logging.getLogger(__name__)


class FileLock:
    """A lock on ``path`` (created if missing), re-entrant within the object that holds it.

    Keep one object per path and process: two objects of one process on one path exclude
    each other like two processes would (the second waits its whole timeout).
    """

    def __init__(self, path: Path, timeout: float) -> None:
        import filelock

        self.path = path
        self.timeout = timeout
        self._lock = filelock.FileLock(str(path), timeout=timeout)

    def acquire(self) -> None:
        try:
            self._lock.acquire()
        except TimeoutError as exc:  # filelock's Timeout
            raise LockTimeout(
                "lock busy",
                thing=str(self.path),
                cause=f"another process held it for {self.timeout:g} s",
            ) from exc
        except OSError as exc:
            cause = exc.strerror or str(exc)
            raise LayoutError("cannot take lock", thing=str(self.path), cause=cause) from exc

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def file_lock(path: Path, timeout: float) -> FileLock:
    """A lock on ``path``; see ``FileLock``."""
    return FileLock(path, timeout)


@contextmanager
def maybe_locked(path: Path | None, timeout: float) -> Iterator[None]:
    """Hold the lock on ``path`` if it can be had within ``timeout``; else go on without it.

    For locks that only space out work (control commands of many ranks' ladders): such work
    must never fail for want of the lock. Nor is a directory made for it: where the lock's
    directory is gone (a cleaner removed the job's), taking it would make that path again.
    """
    if path is None or not os.path.isdir(path.parent):
        yield
        return
    held = file_lock(path, timeout=timeout)
    try:
        held.acquire()
    except (LockTimeout, LayoutError) as exc:
        log.warning("%s: going on without it", exc.line())
        yield
        return
    try:
        yield
    finally:
        held.release()
