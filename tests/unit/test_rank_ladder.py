"""A run's ranks ended through their daemons' ladders (``supervise._terminate_clients``):
every GPU's ladder runs at once with the others', and what each ended is counted on its rank.

Fake daemons stand in for the per-GPU ladder, which the contract and functional suites test
with the simulated MPS."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mpswrap import _proc
from mpswrap.job import supervise
from mpswrap.mps.ladder import StopReport

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


@pytest.fixture
def _trees_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each fake rank's tree is itself, without a reading of this machine's processes."""
    monkeypatch.setattr(_proc, "descendants", lambda pids, table=None: {})
    monkeypatch.setattr(supervise.Rank, "tree", lambda self, table=None: [self.ident])


@pytest.mark.usefixtures("_trees_of_their_own")
def test_every_gpus_ladder_runs_at_once_and_each_rank_counts_its_clients() -> None:
    meet = threading.Barrier(4)
    daemons = [_Daemon(f"g{i}", meet) for i in range(4)]
    ranks = [_rank(1000 + i, daemons[i % 4]) for i in range(8)]  # cyclic: two ranks a GPU
    ended = supervise._terminate_clients(ranks)
    assert ended == {r.ident.pid for r in ranks}
    assert [d.asked for d in daemons] == [{1000 + i, 1004 + i} for i in range(4)]
    assert [r.ended for r in ranks] == [1] * 8


@pytest.mark.usefixtures("_trees_of_their_own")
def test_a_ladder_that_fails_is_said_and_the_others_results_still_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    meet = threading.Barrier(2)

    class _Broken(_Daemon):
        def end_clients(self, pids: set[int]) -> StopReport:
            self.meet.wait(MEET_S)
            raise OSError("the control socket went away")

    broken, good = _Broken("g0", meet), _Daemon("g1", meet)
    ranks = [_rank(1, broken), _rank(2, good)]
    with caplog.at_level("ERROR"):
        assert supervise._terminate_clients(ranks) == {2}
    assert [r.ended for r in ranks] == [0, 1]
    assert "g0: its clients' ladder failed: the control socket went away" in caplog.text


def test_descendants_take_each_pid_once_where_reused_pids_make_a_loop() -> None:
    """A table read while PIDs were reused can name a process its own ancestor's parent."""
    one, two, three = (_proc.ProcId(pid, 1.0) for pid in (101, 102, 103))
    table = {101: [two], 102: [three, one], 103: [two]}
    found = _proc.descendants([101, 102, 999], table)
    assert sorted(p.pid for p in found[101]) == [102, 103]
    assert sorted(p.pid for p in found[102]) == [101, 103]
    assert found[999] == []
