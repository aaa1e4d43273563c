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


@pytest.mark.parametrize("left", [0.0, 0.2])
def test_a_tree_met_with_no_time_left_is_named_and_its_teardown_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, left: float
) -> None:
    """With the deadline passed, or less of it left than a user's teardown needs, a second
    for each of many trees would outlast it."""

    def run(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a teardown run past the deadline")

    monkeypatch.setattr(_proc, "run", run)
    daemons = JobDaemons(JobLayout(tmp_path, "n1", "7", 1000), load_settings({}, env={}))
    done = daemons._stop_as_owner(_wait.Deadline(left))
    assert done.kept == [f"{tmp_path / 'n1' / '7'}: its user's teardown not run: no time left"]


def test_a_users_teardown_gets_what_is_left_of_the_deadline_and_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timeouts: list[float] = []

    def run(*args: Any, timeout: float, **kwargs: Any) -> _proc.Result:
        timeouts.append(timeout)
        return _proc.Result((), 0, "", "")

    monkeypatch.setattr(_proc, "run", run)
    real = _proc.lookup_user
    monkeypatch.setattr(_proc, "lookup_user", lambda uid: real(0))  # uid 1000: maybe no one
    daemons = JobDaemons(JobLayout(tmp_path, "n1", "7", 1000), load_settings({}, env={}))
    daemons._stop_as_owner(_wait.Deadline(0.8))
    assert len(timeouts) == 1 and 0.5 <= timeouts[0] <= 0.8, timeouts


def test_a_daemon_ended_and_removed_by_another_teardown_meanwhile_is_no_leftover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mpswrap stop`` of a farm killed outright races its owners' watchdog: between finding
    the GPU's directory and taking its lock, the watchdog ends the daemon and removes the
    job's directory with the lock's. Nothing of the daemon is left: a clean stop, no
    "cannot take lock" left behind."""
    from mpswrap import _lock
    from mpswrap.errors import LayoutError
    from mpswrap.mps.daemon import Daemon
    from mpswrap.paths import GpuDirs

    job = tmp_path / "job"
    (job / "g0").mkdir(parents=True)

    def acquire(self: Any) -> None:
        for path in sorted(job.rglob("*"), reverse=True):
            path.rmdir()
        job.rmdir()
        raise LayoutError("cannot take lock", thing=str(job / ".g0.lock"), cause="gone")

    monkeypatch.setattr(_lock.FileLock, "acquire", acquire)
    daemon = Daemon(GpuDirs("g0", job / "g0"), job / ".g0.lock", load_settings({}, env={}))
    report = daemon.stop()
    assert not report.leftovers and not report.paths
