"""A run's ranks ended through their daemons' ladders (``supervise._terminate_clients``):
every GPU's ladder runs at once with the others', and what each ended is counted on its rank.

Fake daemons stand in for the per-GPU ladder, which the contract and functional suites test
with the simulated MPS."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mpswrap import _proc
from mpswrap.job import supervise
from mpswrap.mps.ladder import StopReport
from tests.waits import wait_until

#: How long a ladder waits for the others to run at once with it: only a ladder run after
#: another has ended (one GPU after another) waits this long, and then fails.
MEET_S = 30


class _Dirs:
    def __init__(self, key: str) -> None:
        self.key = key
        self.pipe = Path("/nonexistent") / key / "pipe"


class _Daemon:
    """One GPU's daemon whose ladder ends every PID asked, once every GPU's ladder is running."""

    def __init__(self, key: str, meet: threading.Barrier) -> None:
        self.dirs = _Dirs(key)
        self.meet = meet
        self.asked: set[int] = set()

    def end_clients(self, pids: set[int]) -> StopReport:
        self.asked = set(pids)
        self.meet.wait(MEET_S)  # BrokenBarrierError where the ladders run one after another
        return StopReport(key=self.dirs.key, terminated=sorted(pids))


def _rank(pid: int, daemon: _Daemon) -> supervise.Rank:
    return supervise.Rank(proc=None, ident=_proc.ProcId(pid, 0.0), daemon=daemon)  # type: ignore[arg-type]


def test_every_gpus_ladder_runs_at_once_and_each_rank_counts_its_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(supervise.Rank, "tree", lambda self, table=None: [self.ident])
    meet = threading.Barrier(4)
    daemons = [_Daemon(f"g{i}", meet) for i in range(4)]
    ranks = [_rank(1000 + i, daemons[i % 4]) for i in range(8)]  # cyclic: two ranks a GPU
    ended = supervise._terminate_clients(ranks)
    assert ended == {r.ident.pid for r in ranks}
    assert [d.asked for d in daemons] == [{1000 + i, 1004 + i} for i in range(4)]
    assert [r.ended for r in ranks] == [1] * 8


def test_a_ladder_that_fails_is_raised_after_the_others_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(supervise.Rank, "tree", lambda self, table=None: [self.ident])
    meet = threading.Barrier(2)
    good = _Daemon("g0", meet)

    class _Broken(_Daemon):
        def end_clients(self, pids: set[int]) -> StopReport:
            self.meet.wait(MEET_S)
            raise OSError("the control socket went away")

    broken = _Broken("g1", meet)
    with pytest.raises(OSError, match="went away"):
        supervise._terminate_clients([_rank(1, good), _rank(2, broken)])
    assert good.asked == {1}


#: A process with a child, and that child's child, all sleeping until killed.
_SLEEP = "import time; time.sleep(60)"
_START = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {!r}]); "
_FAMILY = _START.format(_START.format(_SLEEP) + _SLEEP) + _SLEEP


def test_descendants_from_one_reading_are_what_children_of_finds() -> None:
    """Two ranks, each a parent with a child and a grandchild: one reading of the process
    table finds each one's, as reading it for each does, and nothing for a PID that is gone."""
    parents = [subprocess.Popen([sys.executable, "-c", _FAMILY]) for _ in range(2)]
    try:
        pids = [p.pid for p in parents]
        wait_until(lambda: all(len(_proc.children_of(p)) == 2 for p in pids), 30, "descendants")
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait(timeout=30)
        table = _proc.descendants([p.pid for p in parents] + [dead.pid])
        for parent in parents:
            assert set(table[parent.pid]) == set(_proc.children_of(parent.pid))
            assert len(table[parent.pid]) == 2
        assert table[dead.pid] == []
    finally:
        for parent in parents:
            _proc.kill_procs(_proc.children_of(parent.pid))
            parent.kill()
            parent.wait(timeout=30)
