"""The task farm's pure parts: the task list, shares, the fault rule, K, calibrate's choice."""

from __future__ import annotations

import time

import pytest

from mpswrap.entry.calibrate import Calibration, counts_up_to, recommend
from mpswrap.entry.farm import default_per_gpu
from mpswrap.errors import UsageError
from mpswrap.job.faultwatch import FaultSeen, is_victim, stamp_time
from mpswrap.job.tasks import FarmDir, Share, TaskRecord, parse_share, parse_tasks
from mpswrap.report.farmview import duration


def test_tasks_skip_blanks_and_comments_and_number_from_zero() -> None:
    tasks = parse_tasks(["# header", "", "python a.py", "   ", "  python b.py  ", "#x"])
    assert [(t.number, t.command) for t in tasks] == [(0, "python a.py"), (1, "python b.py")]


@pytest.mark.parametrize(
    ("line", "argv"),
    [
        ("python train.py --seed 3", ["python", "train.py", "--seed", "3"]),
        ("python 'my file.py' --name \"a b\"", ["python", "my file.py", "--name", "a b"]),
        ("python a.py > out.txt", ["/bin/sh", "-c", "python a.py > out.txt"]),
        ("cd run3 && python a.py", ["/bin/sh", "-c", "cd run3 && python a.py"]),
        ("SEED=3 python a.py", ["/bin/sh", "-c", "SEED=3 python a.py"]),
        ("python a.py --seed $MPSWRAP_TASK", ["/bin/sh", "-c", "python a.py --seed $MPSWRAP_TASK"]),
        ("python a.py data/*.h5", ["/bin/sh", "-c", "python a.py data/*.h5"]),
        ("python a.py # a comment", ["/bin/sh", "-c", "python a.py # a comment"]),
        ("python a.py --lr=0.1", ["python", "a.py", "--lr=0.1"]),
    ],
)
def test_plain_lines_run_directly_and_shell_syntax_runs_under_sh(
    line: str, argv: list[str]
) -> None:
    assert parse_tasks([line])[0].argv == argv


def test_keys_follow_the_command_not_its_line_and_tell_repeats_apart() -> None:
    first = parse_tasks(["a", "b", "a"])
    moved = parse_tasks(["b", "# new comment", "a", "a", "c"])
    assert first[0].key == moved[1].key and first[2].key == moved[2].key
    assert first[0].key != first[2].key
    assert first[1].key == moved[0].key


def test_an_open_quote_is_a_usage_error_naming_the_line() -> None:
    with pytest.raises(UsageError, match="bad task on line 2"):
        parse_tasks(["true", "echo 'open"])


@pytest.mark.parametrize("text", ["2/2", "1", "a/b", "-1/2", "0/0", "1/2/3", ""])
def test_bad_shares_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="bad --share"):
        parse_share(text)


def test_shares_split_tasks_disjointly_and_cover_them_all() -> None:
    tasks = parse_tasks([f"t{i}" for i in range(10)])
    picked = [[t.number for t in tasks if Share(i, 3).picks(t)] for i in range(3)]
    assert picked == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert parse_share("1/3") == Share(1, 3)
    assert Share().state_name == "state.jsonl" and Share(1, 3).state_name == "state-1of3.jsonl"


def _record(task: int, key: str, status: str) -> TaskRecord:
    return TaskRecord(task, key, "cmd", 1, status, 0, "n", "GPU-x", 0, 0.0, 1.0, "o", "e")


def test_finished_reads_every_state_file_and_passes_over_lines_that_are_not_records(
    tmp_path: object,
) -> None:
    from pathlib import Path

    root = Path(str(tmp_path))
    FarmDir(root, Share(0, 2)).create().append(_record(0, "k0", "done"))
    FarmDir(root, Share(1, 2)).append(_record(1, "k1", "failed"))
    FarmDir(root).append(_record(2, "k2", "done"))
    with open(root / "state.jsonl", "a") as state:
        state.write('{"task": 3, "key": "k3", "stat\n[1, 2]\n{"task": "x"}\n')
    assert FarmDir(root).finished() == {"k0", "k2"}


def _fault(at: float, pids: set[int] | None = None, recovered: float | None = None) -> FaultSeen:
    return FaultSeen(("stamp", 1, 1), at, pids or set(), recovered_at=recovered)


@pytest.mark.parametrize(
    ("start", "end", "victim"),
    [
        (90.0, 100.5, True),  # running when the fault came: its client had the error
        (100.2, 100.3, True),  # started while the server handled it: refused
        (100.2, 102.8, True),  # started before the server took clients again, failed then
        (100.2, 104.0, False),  # ran on well past the recovery: it was not refused
        (90.0, 99.5, False),  # failed and gone before the fault
        (102.5, 103.0, False),  # started after the server recovered: its failure is its own
        (90.0, 500.0, False),  # not hit (it never was a client then): it failed much later
    ],
)
def test_a_failure_is_a_faults_victim_when_it_was_alive_while_the_server_handled_it(
    start: float, end: float, victim: bool
) -> None:
    assert is_victim({1}, start, end, [_fault(100.0, {7}, recovered=102.0)]) is victim


def test_a_named_client_is_a_victim_even_where_the_stamp_does_not_parse() -> None:
    unparsed = FaultSeen(("?", 1, 6), None, {6})
    assert is_victim({5, 6}, 0.0, 1.0, [unparsed])
    assert not is_victim({5}, 0.0, 1.0, [unparsed])
    assert not is_victim({5}, 0.0, 1.0, [])


def test_a_pid_named_by_an_old_fault_does_not_make_a_later_task_its_victim() -> None:
    assert is_victim({7}, 90.0, 500.0, [_fault(100.0, {7}, recovered=102.0)])
    assert not is_victim({7}, 300.0, 301.0, [_fault(100.0, {7}, recovered=102.0)])


def test_a_fault_not_recovered_yet_takes_every_later_failure() -> None:
    assert is_victim({1}, 200.0, 201.0, [_fault(100.0)])


def test_stamps_are_local_time_with_milliseconds() -> None:
    when = stamp_time("2026-11-22 06:53:48.123")
    assert when is not None
    assert time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) == "2026-11-22 06:53:48"
    assert round(when % 1, 3) == 0.123
    assert stamp_time("garbage") is None and stamp_time("") is None


@pytest.mark.parametrize(
    ("limit", "gpus", "cpus", "k"),
    [
        (48, 1, 16, 16),
        (48, 1, 64, 16),
        (48, 2, 16, 8),
        (48, 4, 2, 1),
        (3, 1, 16, 3),
        (0, 1, 8, 1),
    ],
)
def test_the_default_k_is_bounded_by_the_limit_the_cpus_and_sixteen(
    limit: int, gpus: int, cpus: int, k: int
) -> None:
    assert default_per_gpu(limit, gpus, cpus) == k


def test_calibrate_counts_double_up_to_the_top() -> None:
    assert counts_up_to(1) == [1]
    assert counts_up_to(12) == [1, 2, 4, 8, 12]
    assert counts_up_to(16) == [1, 2, 4, 8, 16]


def test_calibrate_recommends_the_best_clean_mps_configuration() -> None:
    rows = [
        Calibration(8, "time-sliced", [1.0], 0),  # fastest, but not MPS
        Calibration(8, "mps", [2.0], 0),
        Calibration(12, "mps", [2.0], 0),  # 6 copies/s
        Calibration(16, "mps-200/n", [2.0], 1),  # 8 copies/s, but a copy failed
    ]
    best = recommend(rows)
    assert best is not None and (best.copies, best.mode) == (12, "mps")
    assert recommend(rows[:1]) is None


def test_durations_read_like_a_clock() -> None:
    assert [duration(s) for s in (0, 42.4, 65, 3600 + 61)] == ["0s", "42s", "1m05s", "1h01m"]


def _fault_lines(stamp: str, server: int, pids: list[int]) -> str:
    head = f"[{stamp} Server {server}] "
    lines = [
        f"Client {{PID: {pids[0]}, Context: 1}} encountered a fatal GPU error.",
        "The following client process have a sticky error set:",
        *map(str, pids),
        "Destroy server context on device 0",
    ]
    return "".join(head + line + "\n" for line in lines)


def test_faults_are_known_by_stamp_not_by_their_place_in_the_log(tmp_path: object) -> None:
    """Only the log's end is read: when an old fault drops out of it, a new one must still be
    new, with its own time and clients."""
    from pathlib import Path
    from types import SimpleNamespace

    from mpswrap.job.faultwatch import FaultWatch

    log_dir = Path(str(tmp_path))
    server_log = log_dir / "server.log"
    server_log.write_text(_fault_lines("2026-11-24 06:00:00.000", 9, [1, 2]))
    watch = FaultWatch(SimpleNamespace(dirs=SimpleNamespace(log=log_dir)))  # type: ignore[arg-type]
    assert watch.refresh() == []  # a fault from before the farm is not the farm's
    with open(server_log, "a") as log:
        log.write(_fault_lines("2026-11-24 06:01:00.000", 9, [3, 4]))
    first = watch.refresh()
    assert [f.pids for f in first] == [{3, 4}]
    server_log.write_text(_fault_lines("2026-11-24 06:02:00.500", 9, [5, 6, 7]))  # the rest cut
    second = watch.refresh()
    assert [f.pids for f in second] == [{5, 6, 7}]
    assert second[0].time == stamp_time("2026-11-24 06:02:00.500")
    assert first[0].pids == {3, 4} and first[0].time == stamp_time("2026-11-24 06:01:00.000")
    assert watch.refresh() == []  # unchanged: not read again
