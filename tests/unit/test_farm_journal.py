"""The farm's journal and what is folded from it: the controls' rules, the joblog's lines, the
progress counts, the per-user profile, the CPU-light floor of K."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest

from mpswrap.errors import LayoutError, UsageError
from mpswrap.taskfarm.controls import (
    FAULT_RETRIES,
    OOM_TRIES,
    Halt,
    after_failure,
    parse_halt,
    retry_left,
)
from mpswrap.taskfarm.fold import fold
from mpswrap.taskfarm.joblog import HEADER, joblog_line
from mpswrap.taskfarm.journal import FarmDir, TaskRecord, as_line, read_journal, record_of
from mpswrap.taskfarm.packing import Packing
from mpswrap.taskfarm.profile import Profile, command_key
from mpswrap.taskfarm.sizing import cpu_floor
from mpswrap.taskfarm.view import state_words
from mpswrap.taskfarm.words import summary_lines


def _record(task: int, status: str, *, attempt: int = 1, code: int = 0, **kw: object) -> TaskRecord:
    return TaskRecord(
        task,
        f"k{task}",
        f"cmd {task}",
        attempt,
        status,
        code,
        "n1",
        "GPU-a",
        0,
        10.0,
        12.5,
        f"o{task}",
        f"e{task}",
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("text", "halt"),
    [
        ("never", Halt()),
        ("soon,fail=3", Halt("soon", 3)),
        ("now,fail=1", Halt("now", 1)),
        ("soon,fail=10%", Halt("soon", 10, True)),
        ("now,success=1", Halt("now", 1, what="success")),
        ("soon,done=50%", Halt("soon", 50, True, "done")),
    ],
)
def test_halt_reads_parallels_forms(text: str, halt: Halt) -> None:
    assert parse_halt(text) == halt
    assert str(halt) == text


@pytest.mark.parametrize(
    ("number", "form"),
    [
        ("0", "never"),
        ("1", "soon,fail=1"),
        ("2", "now,fail=1"),
        ("-1", "soon,success=1"),
        ("-2", "now,success=1"),
    ],
)
def test_halt_reads_parallels_older_numbers(number: str, form: str) -> None:
    assert parse_halt(number) == parse_halt(form)


@pytest.mark.parametrize(
    "text",
    ["", "soon", "later,fail=1", "now,fail=0", "soon,fail=101%", "now,won=1", "3", "soon,done=٣"],
)
def test_a_bad_halt_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="bad --halt"):
        parse_halt(text)


def test_halt_counts_failures_for_good_of_the_tasks() -> None:
    assert not Halt().reached(100, 100)
    assert not Halt("soon", 2).reached(1, 10) and Halt("soon", 2).reached(2, 10)
    assert not Halt("now", 10, True).reached(1, 20) and Halt("now", 10, True).reached(2, 20)
    assert Halt("now", 1, True).reached(10, 1000) and not Halt("now", 1, True).reached(9, 1000)
    assert Halt("now", 1, True).reached(1, 5)  # at least one
    # On success: the tasks done count, not the failed; on done: both.
    assert not Halt("now", 1, what="success").reached(5, 10, 0)
    assert Halt("now", 1, what="success").reached(0, 10, 1)
    assert Halt("soon", 3, what="done").reached(1, 10, 2)
    assert not Halt("soon", 3, what="done").reached(1, 10, 1)


def test_retries_for_any_failure_and_faults_and_oom_keep_their_own() -> None:
    assert not retry_left("failed", 1, 0, 0) and retry_left("failed", 1, 0, 1)
    assert retry_left("timeout", 2, 0, 2) and not retry_left("timeout", 3, 0, 2)
    assert retry_left("fault", FAULT_RETRIES, 0, 0) and not retry_left("fault", 2, 0, 0)
    assert retry_left("fault", 3, 0, 3)  # --retries gives faults more, never fewer
    assert retry_left("oom", 5, OOM_TRIES - 1, 0) and not retry_left("oom", 1, OOM_TRIES, 9)


def test_the_joblog_line_is_parallels_nine_columns() -> None:
    names = "Seq Host Starttime JobRuntime Send Receive Exitval Signal Command"
    assert HEADER.rstrip("\n").split("\t") == names.split()
    line = joblog_line(_record(6, "failed", code=143, signal=15)).rstrip("\n").split("\t")
    assert line == ["7", "n1", "10.000", "2.500", "0", "0", "143", "15", "cmd 6"]
    tabbed = joblog_line(TaskRecord(0, "k", "a\tb\nc", 1, "done", 0, "", "g", 0, 1, 2, "o", "e"))
    assert tabbed.count("\t") == 8 and tabbed.endswith("\ta b c\n")
    assert tabbed.split("\t")[1] == ":"  # parallel's word for this host


def test_a_journal_record_is_typed_or_passed_over() -> None:
    good = as_line(_record(1, "done"))
    assert record_of(good) == _record(1, "done")
    changes: list[dict[str, object]] = [
        {"status": "won"},
        {"task": "1"},
        {"start": 1e300},
        {"attached": "yes"},
        {"retried": 1},
        {"extra": 1},
    ]
    for change in changes:
        assert record_of({**good, **change}) is None, change


def _farm(todo: int, *lines: dict[str, object]) -> list[dict[str, object]]:
    head = {"event": "farm", "time": 5.0, "node": "n1", "pid": 1, "todo": todo, "slots": 2}
    return [head, *lines]


def test_a_torn_last_line_never_swallows_the_next_runs_first_line(tmp_path: Path) -> None:
    whole = json.dumps({"event": "end", "code": 1, "time": 1.0})
    (tmp_path / "state.jsonl").write_text(whole + '\n{"attached": null, "comm')
    journal = FarmDir(tmp_path)
    journal.write({"event": "farm", "todo": 2, "time": 2.0})
    journal.write(as_line(_record(0, "done")))
    journal.close()
    lines = read_journal(tmp_path)["state.jsonl"]
    assert [line.get("event") for line in lines] == ["end", "farm", None]
    assert fold(lines).total == 2


def test_a_short_journal_write_is_written_on_and_a_failed_one_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real, journal, left = os.write, FarmDir(tmp_path), [5]

    def short(fd: int, data: bytes) -> int:
        if not left[0]:
            raise OSError(28, "No space left on device")
        left[0] -= 1
        return real(fd, data[:7])

    monkeypatch.setattr(os, "write", short)
    journal.write({"event": "farm", "todo": 1})  # 29 bytes, 7 at a time: whole
    with pytest.raises(LayoutError, match="cannot write the farm's journal"):
        journal.write({"event": "end", "code": 0})  # the disk fills up midway
    monkeypatch.setattr(os, "write", real)
    journal.write({"event": "end", "code": 1})  # on a line of its own
    journal.close()
    lines = read_journal(tmp_path)["state.jsonl"]
    assert lines == [{"event": "farm", "todo": 1}, {"event": "end", "code": 1}]


def test_progress_counts_what_runs_after_the_wake_and_says_tasks() -> None:
    start = {"event": "start", "task": 2, "attempt": 1, "time": 11.0, "gpu": "GPU-a"}
    tally = fold(
        _farm(
            4,
            as_line(_record(0, "done")),
            as_line(_record(1, "failed", code=3, retried=True)),
            as_line(_record(1, "done", attempt=2)),
            start,
            as_line(_record(3, "interrupted", code=143)),
        )
    )
    assert (tally.done, tally.failed, tally.interrupted, tally.now_running) == (2, 0, 1, 1)
    assert (tally.retried, tally.not_run) == (1, 1)  # the interrupted task runs again
    words = state_words(tally, 12.0)
    assert words.startswith("2/4 finished (2 done, 0 failed, 1 interrupted), 1 running")
    head = summary_lines(tally, [], "d", 20.0)[0]
    assert head.startswith("farm: 4 tasks: 2 done, 0 failed, 1 interrupted, 1 running, 0 not")


def test_a_failure_settled_later_by_success_is_no_failure() -> None:
    tally = fold(
        _farm(1, as_line(_record(0, "fault", code=1)), as_line(_record(0, "done", attempt=2)))
    )
    assert (tally.done, tally.failed, tally.failures()) == (1, 0, [])
    assert tally.gpus[0].statuses == Counter(fault=1, done=1)


def test_the_attempts_outcomes_are_the_nodes_summary_line() -> None:
    from mpswrap.taskfarm.recorder import outcomes

    tally = fold(
        _farm(2, as_line(_record(0, "done", attached=True)), as_line(_record(1, "failed", code=5)))
    )
    assert sorted((o.code, o.attached) for o in outcomes(tally)) == [(0, True), (5, None)]


def test_a_profile_knows_a_command_by_its_text_without_digits(tmp_path: Path) -> None:
    assert command_key("train.py --seed 3") == command_key("train.py  --seed 41")
    assert command_key("train.py --seed 3") != command_key("eval.py --seed 3")
    path = tmp_path / "p.json"
    profile = Profile(path)
    profile.learn("train.py --seed 1", [8 << 30], [12.0, 14.0], 6)
    profile.save()
    known = Profile(path).of(["train.py --seed 2", "train.py --seed 3", "other"])
    assert known is not None and (known.peak, known.seconds, known.k) == (8 << 30, 13.0, 6)
    assert Profile(path).of(["other", "another", "train.py --seed 2"]) is None  # a third known
    path.write_text(json.dumps({command_key("x"): {"peak": "big"}, "short": {}}))
    assert Profile(path).known == {}
    path.write_text("\x00not json")
    assert Profile(path).known == {}
    assert Profile(None).of(["x"]) is None


def test_k_of_cpu_light_tasks_never_falls_below_the_cpus() -> None:
    assert cpu_floor(1.0, 10.0, 8, 16) == 8  # a tenth of a CPU: the GPU's pace, not the CPU's
    assert cpu_floor(9.0, 10.0, 8, 16) == 1
    assert cpu_floor(1.0, 10.0, 8, 4) == 4  # never above the cap
    assert cpu_floor(0.0, 0.0, 8, 16) == 1  # nothing measured
    packing = Packing.start(0.0, 16)
    packing.floor = 8
    packing.judge(1.0, 10.0)  # the first window at 16, flat: lower, but not below 8
    assert packing.k == 8
    packing.judge(2.0, 10.0)
    assert packing.k == 8 and packing.settled


class _Tty:
    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_the_bar_ends_its_line_and_quiet_shows_failures_only() -> None:
    from mpswrap.taskfarm.view import Progress

    tally = fold(_farm(2, as_line(_record(0, "done")), as_line(_record(1, "failed", code=3))))
    tty = _Tty()
    bar = Progress("auto", stream=tty)  # type: ignore[arg-type]
    bar.drawn = 0.0
    bar.report([], tally)
    assert tty.text.startswith("\rmpswrap: farm: 2/2 finished") and not tty.text.endswith("\n")
    bar.close()
    assert tty.text.endswith("\n")  # what follows (the summary) starts a line of its own
    shown = _Tty()
    quiet = Progress("quiet", stream=shown)  # type: ignore[arg-type]
    quiet.report([_record(0, "done"), _record(1, "failed", code=3)], tally)
    assert shown.text == "mpswrap: farm: task 1 failed (exit 3) (gpu 0, 2.5 s, log e1)\n"


def test_a_failure_a_stopping_farm_would_have_retried_is_interrupted_not_failed() -> None:
    """A signal that comes while a failed task awaits its verdict: with a retry left the task
    is interrupted (a farm run again runs it, also with --skip-failed); without one, or under
    a halt that lets running tasks finish, it stays failed; else it runs again."""
    assert after_failure("failed", True, stopping=True, halting=False) == ("interrupted", False)
    assert after_failure("oom", True, stopping=True, halting=True) == ("interrupted", False)
    assert after_failure("failed", False, stopping=True, halting=False) == ("failed", False)
    assert after_failure("timeout", True, stopping=False, halting=True) == ("timeout", False)
    assert after_failure("fault", True, stopping=False, halting=False) == ("fault", True)


def test_after_a_halt_the_eta_counts_the_running_tasks_only() -> None:
    """Tasks a halt leaves unrun never run: no ETA counts them, and the line says so."""
    start = {"event": "start", "task": 1, "attempt": 1, "time": 10.0, "gpu": "GPU-a"}
    lines = _farm(10, as_line(_record(0, "failed", code=3)), start)
    before = state_words(fold(lines), 12.0)
    halt = {"event": "halt", "time": 11.0, "why": "--halt soon,fail=1"}
    after = state_words(fold([*lines, halt]), 12.0)
    assert "halted" not in before and "ETA" in before
    assert ", halted (--halt soon,fail=1): no more tasks start, ETA " in after
    assert _eta_seconds(after) < _eta_seconds(before)
    ended = {"event": "exit", "task": 1, "attempt": 1, "time": 12.0}
    assert "ETA" not in state_words(fold([*lines, halt, ended]), 13.0)


def _eta_seconds(words: str) -> int:
    text = words.rsplit("ETA ", 1)[1]
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", text))


def test_only_the_last_line_of_a_wake_says_where_the_farm_stands() -> None:
    """The tally is the farm's after every attempt of the wake: a line before the last would
    count attempts that come after it."""
    import io

    from mpswrap.taskfarm.view import Progress

    records = [_record(0, "done"), _record(1, "done")]
    tally = fold(_farm(3, *map(as_line, records)))
    out = io.StringIO()
    Progress("lines", out, heartbeat=0).report(records, tally)
    first, second = out.getvalue().splitlines()
    assert "[" not in first
    assert "[2/3 finished (2 done, 0 failed), 0 running" in second


def test_a_dry_run_refuses_a_directory_another_farm_holds(tmp_path: Path) -> None:
    """``farm --dry-run`` says what the farm would: another farm holds the directory's lock
    for this share (a flock, as ``_only_farm`` takes it). Nothing is created, held or left."""
    from mpswrap._lock import file_lock
    from mpswrap.errors import UsageError

    farm_dir = FarmDir(tmp_path / "t.farm")
    farm_dir.check()  # nothing there yet: no farm holds it, nothing made
    assert not farm_dir.path.exists()
    farm_dir.create()
    held = file_lock(farm_dir.lock_path, timeout=0)
    held.acquire()
    try:
        with pytest.raises(UsageError, match="another farm runs in this directory"):
            farm_dir.check()
    finally:
        held.release()
    farm_dir.check()  # released: the farm may run
    held.acquire()  # and the dry run left nothing held
    held.release()
