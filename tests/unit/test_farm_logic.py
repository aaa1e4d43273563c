"""The task farm's pure parts: the task list, shares, the fault rule, K, calibrate's choice."""

from __future__ import annotations

import time

import pytest

from mpswrap.entry.calibrate import Calibration, counts_up_to, recommend
from mpswrap.errors import UsageError
from mpswrap.taskfarm.faultwatch import FaultSeen, is_victim, stamp_time
from mpswrap.taskfarm.journal import FarmDir, TaskRecord, as_line
from mpswrap.taskfarm.sizing import default_per_gpu
from mpswrap.taskfarm.tasks import Share, parse_share, parse_tasks, task_lines
from mpswrap.taskfarm.view import duration


def test_tasks_skip_blanks_and_comments_and_number_from_zero() -> None:
    tasks = parse_tasks(["# header", "", "python a.py", "   ", "  python b.py  ", "#x"])
    assert [(t.number, t.command) for t in tasks] == [(0, "python a.py"), (1, "python b.py")]


@pytest.mark.parametrize(
    "line",
    [
        "python train.py --seed 3",
        "exit 5",
        "python a.py > out.txt",
        "cd run3 && python a.py",
        "python a.py --seed $MPSWRAP_TASK",
    ],
)
def test_every_line_is_a_shell_command_line(line: str) -> None:
    assert parse_tasks([line])[0].argv == ["/bin/sh", "-c", line]


def test_tasks_know_their_line_in_the_list() -> None:
    tasks = parse_tasks(["# head", "", "a", "b"])
    assert [(t.number, t.line) for t in tasks] == [(0, 3), (1, 4)]


def test_keys_follow_the_command_not_its_line_and_tell_repeats_apart() -> None:
    first = parse_tasks(["a", "b", "a"])
    moved = parse_tasks(["b", "# new comment", "a", "a", "c"])
    assert first[0].key == moved[1].key and first[2].key == moved[2].key
    assert first[0].key != first[2].key
    assert first[1].key == moved[0].key


def test_an_open_quote_is_a_usage_error_naming_the_line() -> None:
    with pytest.raises(UsageError, match=r"^tasks.txt:2: bad task: No closing quotation"):
        parse_tasks(["true", "echo 'open"], "tasks.txt")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"true\n# fine\necho a\0b\n", "tasks.txt:3: the line has a NUL byte"),
        (b"true\n\nprintf '\xff\xfe'\n", "tasks.txt:3: the line is not UTF-8 text (byte 0xff"),
        (b"true\necho " + b"x" * 65536 + b"\n", "tasks.txt:2: the line is longer than 64 KiB"),
        (b"true\x00\n" + b"\xff\n", "tasks.txt:1: the line has a NUL byte"),  # the first
    ],
)
def test_a_task_list_that_is_not_lines_of_text_names_the_first_bad_line(
    data: bytes, says: str
) -> None:
    with pytest.raises(UsageError) as caught:
        parse_tasks(task_lines(data, "tasks.txt"), "tasks.txt")
    assert str(caught.value).startswith(says), caught.value
    assert "\n" not in str(caught.value)


def test_the_python_api_checks_its_lines_too() -> None:
    with pytest.raises(UsageError, match=r"^tasks:2: the line has a NUL byte"):
        parse_tasks(["true", "echo a\0b"])
    with pytest.raises(UsageError, match=r"^tasks:1: the line is longer than 64 KiB"):
        parse_tasks(["echo " + "é" * 40000])  # 80,005 bytes of UTF-8
    assert parse_tasks(["echo " + "x" * 65000])[0].line == 1


def test_lines_end_where_an_editor_ends_them() -> None:
    assert task_lines(b"a\r\nb\x0cc\n\nd", "t") == ["a", "b\x0cc", "", "d"]


def test_a_byte_order_mark_is_no_part_of_the_first_task() -> None:
    """An editor's "UTF-8 with BOM": the list's first line is ``true``, not ``\ufefftrue``
    (which the shell runs as a command not found); a BOM inside a line stays."""
    assert task_lines(b"\xef\xbb\xbftrue\r\necho \xef\xbb\xbf\n", "t") == ["true", "echo \ufeff"]


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
    for share, record in (
        (Share(0, 2), _record(0, "k0", "done")),
        (Share(1, 2), _record(1, "k1", "failed")),
        (Share(), _record(2, "k2", "done")),
    ):
        farm_dir = FarmDir(root, share).create()
        farm_dir.write(as_line(record))
        farm_dir.close()
    with open(root / "state.jsonl", "a") as state:
        state.write('{"task": 3, "key": "k3", "stat\n[1, 2]\n{"task": "x"}\n')
    assert FarmDir(root).last_status() == {"k0": "done", "k1": "failed", "k2": "done"}


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

    from mpswrap.taskfarm.faultwatch import FaultWatch

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


def test_the_eta_spreads_the_mean_attempt_over_the_places() -> None:
    from collections import Counter

    from mpswrap.taskfarm.fold import Running, Tally
    from mpswrap.taskfarm.view import eta

    def running(*since: float) -> dict[tuple[int, int], Running]:
        return {(i, 1): Running(i, i, 1, "n", "g", 0, s) for i, s in enumerate(since)}

    tally = Tally(10, slots=4, attempts=2, busy=20.0, statuses=Counter(done=2))
    tally.running = running(95.0, 99.0)
    # 6 waiting at the mean (10 s) and the running ones' 5 s and 9 s left, over 4 places.
    assert eta(tally, 100.0) == (6 * 10 + 5 + 9) / 4
    tally.total = 4  # none waiting: the running task with most left
    assert eta(tally, 100.0) == 9.0
    tally.running, tally.total = running(80.0), 3  # past the mean: as long again as it ran
    assert eta(tally, 100.0) == 20.0
    tally.running = running(90.5)  # just short of the mean: never 0 while a task runs
    assert eta(tally, 100.0) == 1.0
    # Nothing finished yet: a task takes at least what the oldest running one has run (the
    # issue's ETA 0s while a 25 s task had run for 4 s).
    young = Tally(4, slots=4)
    young.running = running(96.0)
    assert eta(young, 100.0) == (3 * 4 + 4) / 4
    assert eta(Tally(4, slots=4), 100.0) is None  # nothing ran yet


def _journal() -> list[dict[str, object]]:
    def start(task: int, attempt: int, at: float) -> dict[str, object]:
        return {
            "event": "start",
            "task": task,
            "line": task + 2,
            "attempt": attempt,
            "node": "n1",
            "gpu": "GPU-a",
            "gpu_index": 0,
            "time": at,
        }

    def record(task: int, attempt: int, status: str, retried: bool = False) -> dict[str, object]:
        rec = TaskRecord(
            task,
            f"k{task}",
            "cmd",
            attempt,
            status,
            0,
            "n1",
            "GPU-a",
            0,
            10.0,
            14.0,
            "o",
            "e",
            retried,
        )
        return dict(rec.__dict__)

    return [
        {**record(4, 1, "done"), "end": 9.0},  # a run before this one: counted in "skipped"
        {
            "event": "farm",
            "time": 10.0,
            "node": "n1",
            "pid": 7,
            "pid_start": 5.0,
            "todo": 4,
            "skipped": 1,
            "slots": 2,
        },
        start(0, 1, 10.0),
        start(1, 1, 10.0),
        record(0, 1, "done"),
        record(1, 1, "fault", retried=True),
        start(1, 2, 14.0),
        start(2, 1, 14.5),
    ]


def test_status_folds_the_journal_of_the_last_farm_into_the_progress_counts() -> None:
    from mpswrap.taskfarm.status import directory_status, share_status, status_json, status_lines

    seen: list[tuple[object, object, object]] = []

    def alive(head: dict[str, object]) -> tuple[bool, str]:
        seen.append((head["node"], head["pid"], head["pid_start"]))
        return True, ""

    status = share_status("state.jsonl", _journal(), alive)
    assert seen == [("n1", 7, 5.0)]
    tally = status.tally
    assert status.state == "running" and tally.done_before == 1
    assert (tally.done, tally.failed, tally.retried, tally.now_running) == (1, 0, 1, 2)
    running = sorted(tally.running.values(), key=lambda t: t.since)
    assert [(t.task, t.attempt, t.line) for t in running] == [(1, 2, 3), (2, 1, 4)]
    assert tally.not_run == 1  # task 3: waiting
    lines = status_lines("t.farm", [status], 20.0)
    assert lines[1].startswith("  5 tasks: 1 done, 0 failed, 2 running, 1 not run, 1 done")
    assert "ETA" in lines[1] and "running: task 1 (line 3) on gpu 0, attempt 2" in lines[2]
    shares, totals = directory_status({"state.jsonl": _journal()}, alive)
    data = status_json("t.farm", shares, totals, 20.0)
    assert (data["tasks"], data["running"], data["not_run"]) == (5, 2, 1)
    assert data["shares"][0]["running_tasks"][0]["gpu"] == "GPU-a"


def test_a_farm_gone_without_its_end_runs_nothing_and_one_ended_says_its_code() -> None:
    from mpswrap.taskfarm.status import share_status

    gone = share_status("state.jsonl", _journal(), lambda _: (False, ""))
    assert gone.state == "gone" and not gone.tally.running and gone.tally.not_run == 3
    end = {"event": "end", "time": 30.0, "code": 1}
    ended = share_status("state.jsonl", [*_journal(), end], lambda _: (True, ""))
    assert ended.state == "ended" and ended.tally.code == 1
    elsewhere = share_status("state.jsonl", _journal(), lambda _: (None, ""))
    assert elsewhere.state == "elsewhere" and len(elsewhere.tally.running) == 2


def test_status_shows_what_the_journal_says_as_words_and_refuses_odd_numbers() -> None:
    """The journal is the farm user's file; whoever reads its status (root too) must get no
    terminal control sequences and no crash from a number JSON calls Infinity or NaN."""
    from mpswrap.taskfarm.status import share_status, status_lines

    journal = _journal()
    journal[1] = {**journal[1], "node": "n1\x1b[2J\nforged line", "time": float("inf")}
    journal[-1] = {**journal[-1], "gpu": "GPU-\x07", "time": float("nan")}
    journal.append({**_journal()[4], "task": 3, "status": "failed", "command": "x\x1b[2J"})
    status = share_status("state.jsonl", journal, lambda _: (True, ""))
    lines = status_lines("t.farm", [status], 20.0)
    text = "\n".join(lines)
    assert "\x1b" not in text and "\x07" not in text and "\nforged line" not in text
    assert all(t.since == 0.0 or t.since < 1e300 for t in status.tally.running.values())


def test_calibrate_says_where_mps_loses_to_time_slicing_and_recommends_no_mps() -> None:
    from mpswrap.entry.calibrate import _advice

    best = Calibration(4, "mps-200/n", [2.0], 0)  # 2 copies/s
    won = _advice(best, {1: 0.5, 4: 1.0})
    assert won.startswith("recommended: mpswrap farm --per-gpu 4 --threads oversubscribe")
    lost = _advice(best, {1: 1.0, 4: 2.5})
    assert lost.startswith("recommended: no MPS: 4 copies at once time-sliced did 2.500")
    assert "(0.80x: MPS loses here)" in lost and "without mpswrap" in lost


@pytest.mark.parametrize("job", ["1;reboot", "", "12 34", "-1", "x"])
def test_slurm_is_asked_of_a_job_id_only(job: str) -> None:
    """farm status asks scontrol by the journal's job id: anything else never reaches it."""
    from mpswrap.jobenv import JobEnv
    from mpswrap.slurm.scontrol import job_state

    assert job_state(JobEnv({"PATH": "/nonexistent"}), job) is None
