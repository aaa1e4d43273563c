"""The user's own teardown of a user-mode tree, which root's epilog and ``mpswrap stop`` run
as that user (``JobDaemons._stop_as_owner``): never past the teardown's deadline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mpswrap import _proc, _wait
from mpswrap.config import load_settings
from mpswrap.job.job import JobDaemons
from mpswrap.paths import JobLayout


def test_a_tree_met_with_no_time_left_is_named_and_its_teardown_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the deadline passed, a second for each of many trees would outlast it."""

    def run(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a teardown run past the deadline")

    monkeypatch.setattr(_proc, "run", run)
    daemons = JobDaemons(JobLayout(tmp_path, "n1", "7", 1000), load_settings({}, env={}))
    done = daemons._stop_as_owner(_wait.Deadline(0))
    assert done.kept == [f"{tmp_path / 'n1' / '7'}: its user's teardown not run: no time left"]
