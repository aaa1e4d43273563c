"""File locks between processes of a node: the one owner of filelock.

filelock is imported when a lock is first made, not with mpswrap: with what it brings
(secrets, hashlib, decimal, platform, threading) it cost every per-rank supervisor 4.6 MiB
and some milliseconds (docs/benchmarks.md), and a rank that joins the prolog's daemons never
takes a lock. Root's hooks take ``RootLock`` instead: a plain ``flock`` on a file only root
can reach, never one in a directory a job user owns. A job's owner lock is a ``DirLock``: a
plain ``flock`` on a file of the job directory held open, so that a directory removed
meanwhile is never made again at its path (as filelock makes a lock's missing directories).
Errors do not leave this module: a lock
not had in time is ``LockTimeout`` (a ``TimeoutError``), a lock file that cannot be opened a
``LayoutError`` (an ``OSError``).
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ._wait import backoff
from .errors import LayoutError, LockTimeout

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = ["DirLock", "FileLock", "RootLock", "file_lock", "held_elsewhere", "maybe_locked"]

log = logging.getLogger(__name__)


class FileLock:
    """A lock on ``path`` (created if missing), re-entrant within the object that holds it.

    Keep one object per path and process: two objects of one process on one path exclude
    each other like two processes would (the second waits its whole timeout). The object,
    not a thread, holds it: a daemon's start takes its lock in one thread and ends in
    another (a node's GPUs come up side by side), which releases it (filelock's own locks
    are per thread by default, and one released in another thread stays held).
    """

    def __init__(self, path: Path, timeout: float) -> None:
        import filelock

        self.path = path
        self.timeout = timeout
        self._lock = filelock.FileLock(str(path), timeout=timeout, thread_local=False)

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

    def release(self, remove: bool = False) -> None:
        """Release; ``remove`` is for ``RootLock``'s callers: this file goes with the
        job directory it is in."""
        self._lock.release()

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


#: Open flags of a plain lock's file: never through a link, never blocking on a FIFO.
_FLOCK_OPEN = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class _Flock:
    """An exclusive ``flock`` on ``path``, tried every few milliseconds until its timeout;
    each try opens the file anew (``_open``) and keeps the lock only if ``_names`` says the
    locked file is still the one meant."""

    #: Who holds it, where it cannot be had.
    holder = "another process"

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._fd: int | None = None

    def _open(self) -> int:
        raise NotImplementedError

    def _names(self, fd: int) -> bool:
        return True

    def _take(self, wait: float) -> None:
        for _ in backoff(wait, cap=0.05):
            self._fd = self._try()
            if self._fd is not None:
                return
        raise LockTimeout(
            "lock busy", thing=str(self.path), cause=f"{self.holder} held it for {wait:g} s"
        )

    def _try(self) -> int | None:
        """The locked descriptor, or None."""
        try:
            fd = self._open()
        except OSError as exc:
            raise LayoutError("cannot take lock", thing=str(self.path), cause=exc.strerror) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if self._names(fd):
                return fd
        except OSError:
            pass  # held elsewhere, or removed by its holder meanwhile: try again
        os.close(fd)
        return None

    def release(self, remove: bool = False) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> _Flock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def acquire(self) -> None:
        self._take(self.timeout)


class RootLock(_Flock):
    """An exclusive lock of root's hooks on a file in a directory only root can write
    (``<run_dir>/.locks``): no job user can open, replace or hold it, so none can make a
    teardown wait for it or fail on it.

    ``prepare`` makes that directory; where it cannot (a run_dir an admin left unsafe), root
    goes on without the lock and says so: it only orders root's own hooks, whose steps are
    idempotent. The file may be removed on release (the job is gone): a waiter that then
    gets the lock of the removed file sees that the path names another file, or none, and
    takes the lock again, so two holders never hold two different files of one path.
    """

    holder = "another hook"

    def __init__(self, path: Path, timeout: float, prepare: Callable[[], None]) -> None:
        super().__init__(path, timeout)
        self._prepare = prepare

    def acquire(self, timeout: float | None = None) -> None:
        """Take the lock within ``timeout`` seconds (default: the lock's own; a teardown gives
        what is left of its deadline, if less)."""
        try:
            self._prepare()
        except LayoutError as exc:
            log.warning("%s: going on without root's lock", exc.line())
            return
        self._take(self.timeout if timeout is None else min(timeout, self.timeout))

    def _open(self) -> int:
        return os.open(self.path, _FLOCK_OPEN, 0o600)

    def _names(self, fd: int) -> bool:
        held, now = os.fstat(fd), os.stat(self.path, follow_symlinks=False)
        return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)

    def release(self, remove: bool = False) -> None:
        if self._fd is not None and remove:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        super().release()


def held_elsewhere(path: Path) -> bool:
    """Whether another process holds the lock on ``path`` now (a ``FileLock``'s, a
    ``_Flock``'s): a dry run's question, which creates nothing and leaves nothing held."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file: no one holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # and with it the lock, where it was taken
    return False


def file_lock(path: Path, timeout: float) -> FileLock:
    """A lock on ``path``; see ``FileLock``."""
    return FileLock(path, timeout)


class DirLock(_Flock):
    """An exclusive lock on a file of a directory held open (``directory_fd``), made there if
    missing: where that directory has been removed, the lock cannot be had (``LayoutError``)
    instead of being taken in one made again at its path (filelock makes the missing
    directories of a lock's path, with its own mode). The same lock as a ``FileLock`` on the
    file's path while that path names this directory. ``path``: the file's path, for messages.
    """

    def __init__(self, directory_fd: int, path: Path, timeout: float) -> None:
        super().__init__(path, timeout)
        self.directory_fd = directory_fd

    def _open(self) -> int:
        return os.open(self.path.name, _FLOCK_OPEN, 0o600, dir_fd=self.directory_fd)


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
