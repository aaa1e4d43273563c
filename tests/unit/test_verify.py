"""The attach check's last word (``mpswrap.job.verify.seen_in_logs``): a rank that connected
and exited between two listings counts as attached, from its daemon's control.log."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mpswrap import _proc
from mpswrap.errors import ControlError
from mpswrap.job import verify
from mpswrap.job.verify import Verifier, seen_in_logs
from mpswrap.mps.mpslog import MpsLog


class _Control:
    """A daemon that never answers a listing: the polls see no client."""

    def __init__(self) -> None:
        self.asked = 0

    def clients(self) -> dict[int, list[int]]:
        self.asked += 1
        raise ControlError("get_server_list", cause="no answer")


def _daemon(folder: Path, log: str) -> Any:
    folder.mkdir()
    (folder / "control.log").write_text(log)
    dirs = SimpleNamespace(pipe=folder / "pipe", control_log=folder / "control.log")
    return SimpleNamespace(dirs=dirs, control=_Control())


def _rank(pid: int, running: bool = False) -> Any:
    ident = _proc.ProcId(pid, 1.0)
    return SimpleNamespace(
        name=f"rank {pid}", ident=ident, daemon=None, running=lambda: running, tree=lambda: [ident]
    )


def test_a_rank_its_log_names_is_attached_and_one_it_does_not_is_not_seen(
    tmp_path: Path,
) -> None:
    log = (
        "[2026-11-28 10:00:00.000 Control 10] Starting control daemon using socket x\n"
        # As the real driver writes it (H100, 2026-11-22: docs/gpu-results/).
        "[2026-11-22 07:09:48.197 Control   414] NEW CLIENT 4242 from user 0: Server already "
        "exists\n"
        "[2026-11-28 10:00:01.500 Control 10] NEW CLIENT 777 from user 1000: Server already "
        "exists\n"
    )
    daemon = _daemon(tmp_path / "g0", log)
    other = _daemon(tmp_path / "g1", "")
    checks = [
        Verifier(_rank(4242), daemon, 30.0, "warn"),
        Verifier(_rank(4243), daemon, 30.0, "warn"),
        Verifier(_rank(777), other, 30.0, "warn"),  # named by g0's log, not its own daemon's
    ]
    for check in checks:
        check.next_at = 0.0
        assert not check.failed() and check.done and not check.listed  # gone before a listing
    seen_in_logs(checks)
    assert [c.listed for c in checks] == [True, False, False]


def test_each_log_is_read_once_and_only_where_a_rank_was_not_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[Path] = []
    real = MpsLog.read

    def reading(path: Path) -> MpsLog:
        read.append(path)
        return real(path)

    monkeypatch.setattr(MpsLog, "read", reading)
    g0 = _daemon(tmp_path / "g0", "[2026-11-28 10:00:01.000 Control 10] NEW CLIENT 3 from user 0")
    g1 = _daemon(tmp_path / "g1", "")
    seen = Verifier(_rank(1), g1, 30.0, "warn")
    seen.listed = True
    refused = Verifier(_rank(2), g1, 30.0, "fail")
    refused.refused = True
    unseen = [Verifier(_rank(pid), g0, 30.0, "warn") for pid in (3, 4, 5)]
    seen_in_logs([seen, refused, *unseen])
    assert read == [g0.dirs.control_log]  # g1's ranks were seen or refused: its log unread
    assert [c.listed for c in unseen] == [True, False, False]
    assert seen.listed and not refused.listed


def test_the_checks_of_one_wake_share_one_reading_of_the_process_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """48 running ranks not yet listed: one poll of each reads the process table once, and
    each rank's tree comes from it (its own PID's descendants in that reading); a later wake
    reads it again."""
    readings: list[int] = []
    child = _proc.ProcId(5000, 1.0)  # rank 1000's child

    def table() -> dict[int, list[_proc.ProcId]]:
        readings.append(1)
        return {1000: [child]}

    monkeypatch.setattr(_proc, "process_table", table)
    monkeypatch.setattr(verify, "LISTING_FRESH", 3600.0)  # one wake, however slow the machine
    daemon = _daemon(tmp_path / "g0", "")
    seen: dict[int, list[_proc.ProcId]] = {}

    def rank(pid: int) -> Any:
        ident = _proc.ProcId(pid, 1.0)

        def tree(found: dict[int, list[_proc.ProcId]] | None = None) -> list[_proc.ProcId]:
            assert found is not None
            seen[pid] = found[pid]
            return [ident, *found[pid]]

        return SimpleNamespace(
            name=f"rank {pid}", ident=ident, daemon=daemon, running=lambda: True, tree=tree
        )

    checks = Verifier.for_ranks([rank(1000 + i) for i in range(48)], "warn", 30.0)
    for check in checks:
        check.next_at = 0.0
        assert not check.failed() and not check.done
    assert len(readings) == 1
    assert seen == {1000 + i: ([child] if i == 0 else []) for i in range(48)}
    assert checks[0].pids == {1000, 5000}
    monkeypatch.setattr(verify, "LISTING_FRESH", 0.0)  # the next wake
    checks[1].next_at = 0.0
    checks[1].failed()
    assert len(readings) == 2


def _running(pid: int, daemon: Any) -> Any:
    """A running rank of ``daemon``: its tree is itself and its children in the reading."""
    ident = _proc.ProcId(pid, 1.0)
    return SimpleNamespace(
        name=f"rank {pid}",
        ident=ident,
        daemon=daemon,
        running=lambda: True,
        tree=lambda found=None: [ident, *(found or {}).get(pid, [])],
    )


def test_a_rank_is_refused_only_after_a_fresh_look_at_its_tree_and_its_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fail`` mode, time up: the wake's shared reading (however old) misses the rank's
    child started since, which its daemon already lists; the last word reads both again, so
    the rank is a client, not refused. Earlier polls use the shared reading."""
    child = _proc.ProcId(5000, 1.0)
    tables: list[dict[int, list[_proc.ProcId]]] = [{1000: []}, {1000: [child]}]  # shared, fresh
    readings: list[int] = []

    def table() -> dict[int, list[_proc.ProcId]]:
        readings.append(1)
        return tables[min(len(readings), len(tables)) - 1]

    monkeypatch.setattr(_proc, "process_table", table)
    monkeypatch.setattr(verify, "LISTING_FRESH", 3600.0)
    listings = [set(), {5000}]  # the daemon lists the child from its second listing on
    asked: list[int] = []

    def clients() -> dict[int, list[int]]:
        asked.append(1)
        return {1: sorted(listings[min(len(asked), 2) - 1])}

    daemon = _daemon(tmp_path / "g0", "")
    daemon.control.clients = clients
    check = Verifier(_running(1000, daemon), daemon, 30.0, "fail", verify.Listings())
    check.next_at = 0.0
    assert not check.failed() and not check.done  # within its time: the shared reading
    assert (len(readings), len(asked)) == (1, 1)
    check.start, check.next_at = -1e9, 0.0  # time is up
    assert not check.failed()
    assert check.done and check.listed and not check.refused
    assert (len(readings), len(asked)) == (2, 2)
    assert check.pids == {1000, 5000}


def test_a_rank_still_unlisted_after_the_fresh_look_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_proc, "process_table", lambda: {1000: []})
    daemon = _daemon(tmp_path / "g0", "")
    check = Verifier(_running(1000, daemon), daemon, 0.0, "fail")
    check.next_at = 0.0
    assert check.failed() and check.refused and check.done and not check.listed
    assert daemon.control.asked == 2  # the shared listing and the fresh one
