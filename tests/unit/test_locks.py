"""The locks that only space out work (``_lock.maybe_locked``)."""

from __future__ import annotations

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
