"""File locks: the object, not a thread, holds one (``_lock.FileLock``); the locks that only
space out work (``_lock.maybe_locked``)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mpswrap import _lock
from mpswrap.errors import LockTimeout


def test_a_spacing_lock_whose_directory_is_gone_is_not_taken_nor_made(tmp_path: Path) -> None:
    gone = tmp_path / "job" / ".g0.ranks.lock"
    ran = []
    with _lock.maybe_locked(gone, timeout=1):
        ran.append(True)
    assert ran and not gone.parent.exists()


def test_a_spacing_lock_is_held_where_its_directory_is(tmp_path: Path) -> None:
    path = tmp_path / ".g0.ranks.lock"
    with _lock.maybe_locked(path, timeout=1), pytest.raises(LockTimeout):
        _lock.file_lock(path, timeout=0.2).acquire()


def _in_thread(call: object) -> None:
    thread = threading.Thread(target=call)  # type: ignore[arg-type]
    thread.start()
    thread.join()


def test_a_lock_taken_in_one_thread_is_released_in_another(tmp_path: Path) -> None:
    """A daemon's start takes its lock in the calling thread and finishes, and releases it,
    in a thread of its GPU's own (``_wait.side_by_side``); its stop takes it again there."""
    path = tmp_path / ".g1.lock"
    lock = _lock.file_lock(path, timeout=0.2)
    lock.acquire()
    _in_thread(lock.release)
    _in_thread(lock.acquire)  # the stop, in another GPU thread: no LockTimeout
    lock.release()
    other = _lock.file_lock(path, timeout=0.2)
    other.acquire()  # free again for anyone
    other.release()
