"""The farm's controls (``--halt``, ``--timeout``, ``--retries``, ``--skip-failed``), its
journal as the one record (the summary is the fold of the journal; the joblog reads with awk),
its progress and status views, and the task list refused where it is no list, on the simulator.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from mpswrap.taskfarm.fold import fold
from mpswrap.taskfarm.journal import read_journal
from mpswrap.taskfarm.tasks import read_tasks
from mpswrap.taskfarm.words import summary_lines
from tests.simenv import SimNode

pytestmark = pytest.mark.functional


def records(farm_dir: Path) -> list[dict[str, Any]]:
    lines = read_journal(farm_dir)["state.jsonl"]
    return [line for line in lines if "event" not in line]


def halts(farm_dir: Path) -> list[str]:
    """The reasons of the journal's ``halt`` events."""
    lines = read_journal(farm_dir)["state.jsonl"]
    return [str(d.get("why")) for d in lines if d.get("event") == "halt"]


def client(node: SimNode, seconds: float) -> str:
    return f"{node.client} --seconds {seconds}"


def test_the_summary_is_the_fold_of_the_journal_it_came_from(node: SimNode) -> None:
    tasks, farm_dir = node.root / "tasks.txt", node.root / "f"
    tasks.write_text("".join(f"{client(node, 0.2)}\n" for _ in range(5)) + "exit 4\ntrue\nexit 9\n")
    res = node.run("farm", "--per-gpu", "2", "--dir", str(farm_dir), str(tasks), timeout=120)
    assert res.returncode == 1, res.stderr
    printed = [ln for ln in res.stdout.splitlines() if ln.startswith(("farm:", "  "))]
    tally = fold(read_journal(farm_dir)["state.jsonl"])
    todo = read_tasks(str(tasks))
    not_run = [t for t in todo if t.number not in tally.settled]
    assert tally.ended is not None
    assert summary_lines(tally, not_run, str(farm_dir), tally.ended) == printed
    assert "8 tasks: 6 done, 2 failed, 0 not run" in printed[0]
    # The node's summary line counts the journal's tasks (each its last attempt), and no
    # alarm for the tasks that ended before a check could see them (no CUDA).
    node_line = next(ln for ln in res.stderr.splitlines() if "summary: node" in ln)
    assert "8 tasks" in node_line and "not seen" not in node_line, node_line


def test_the_joblog_is_gnu_parallels_and_awk_reads_it(node: SimNode) -> None:
    tasks, farm_dir = node.root / "tasks.txt", node.root / "f"
    tasks.write_text("true\nexit 3\nsleep 0.2\n")
    res = node.run("farm", "--per-gpu", "3", "--dir", str(farm_dir), str(tasks), timeout=60)
    assert res.returncode == 1, res.stderr
    joblog = (farm_dir / "joblog").read_text().splitlines()
    header = "Seq Host Starttime JobRuntime Send Receive Exitval Signal Command"
    assert joblog[0].split("\t") == header.split()
    failed = subprocess.run(
        ["awk", "-F\t", "NR > 1 && $7 != 0 {print $1, $7, $9}", str(farm_dir / "joblog")],
        text=True,
        capture_output=True,
        check=True,
    )
    assert failed.stdout == "2 3 exit 3\n"
    rows = [ln.split("\t") for ln in joblog[1:]]
    assert sorted(int(r[0]) for r in rows) == [1, 2, 3]
    assert all(float(r[2]) > 1e9 and float(r[3]) >= 0 and len(r) == 9 for r in rows)


def test_a_task_that_leaves_a_process_behind_holds_no_other_task_up(node: SimNode) -> None:
    """A task's background process inherits the shield (TERM ignored): it is killed at once
    when found, not after ``--grace``, during which the farm reaped and started nothing."""
    tasks, farm_dir = node.root / "tasks.txt", node.root / "f"
    tasks.write_text("sleep 60 &\nsleep 0.3\nsleep 0.3\nsleep 60 &\nsleep 0.3\n")
    args = ("farm", "--per-gpu", "1", "--grace", "60", "--dir", str(farm_dir), str(tasks))
    started = time.monotonic()
    res = node.run(*args, timeout=300)
    took = time.monotonic() - started
    assert res.returncode == 0, res.stderr
    assert "left" in res.stderr and "sleep 60" in res.stderr, res.stderr  # said, and ended
    assert took < 45, f"{took:.1f} s: a leftover was given the 60 s grace"
    rows = [ln.split("\t") for ln in (farm_dir / "joblog").read_text().splitlines()[1:]]
    assert all(float(r[3]) < 45 for r in rows), rows
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "60"]]


def test_retries_rerun_any_failure_and_halt_soon_stops_starting(node: SimNode) -> None:
    mark = node.root / "once"
    tasks, farm_dir = node.root / "tasks.txt", node.root / "f"
    tasks.write_text(f"if [ -e {mark} ]; then true; else touch {mark}; exit 7; fi\n")
    res = node.run("farm", "--retries", "1", "--dir", str(farm_dir), str(tasks), timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert [(r["attempt"], r["status"], r["retried"]) for r in records(farm_dir)] == [
        (1, "failed", True),
        (2, "done", False),
    ]
    # The joblog has a line per task, its last attempt's, as parallel --retries writes it.
    rows = (farm_dir / "joblog").read_text().splitlines()[1:]
    assert [r.split("\t")[6] for r in rows] == ["0"], rows
    # So does the node's summary line: one task, its last attempt's exit code.
    node_line = next(ln for ln in res.stderr.splitlines() if "summary: node" in ln)
    assert ": 1 task, " in node_line and "exit codes 0," in node_line, node_line
    halted, farm_dir = node.root / "halt.txt", node.root / "h"
    halted.write_text("exit 1\nexit 2\n" + "sleep 1\n" * 8)
    args = ("farm", "--per-gpu", "1", "--halt", "soon,fail=2", "--dir", str(farm_dir))
    res = node.run(*args, str(halted), timeout=60)
    assert res.returncode == 1
    assert "--halt soon,fail=2: 2 task(s) failed" in res.stderr, res.stderr
    # Once both failures were known, no place took another task while their verdicts were
    # pending: task 2 at most, in the place of the first to fail, before the second did (GNU
    # parallel -j2 --halt soon,fail=2 runs 2 or 3 jobs; before, a place refilled at once).
    assert {0, 1} <= {r["task"] for r in records(farm_dir)} <= {0, 1, 2}
    assert re.search(r"10 tasks: [01] done, 2 failed, [78] not run", res.stdout), res.stdout
    # The journal says once why no more tasks started (the ETA counts the running ones then).
    assert halts(farm_dir) == ["--halt soon,fail=2"]
    # A halt the last task reached held nothing back: the farm ran everything, no halt.
    last, farm_dir = node.root / "last.txt", node.root / "l"
    last.write_text("true\nexit 4\n")
    args = ("farm", "--per-gpu", "1", "--halt", "soon,fail=1", "--dir", str(farm_dir))
    res = node.run(*args, str(last), timeout=60)
    assert res.returncode == 1 and halts(farm_dir) == [], res.stderr


def test_halt_now_on_success_ends_the_others_and_exits_0(node: SimNode) -> None:
    """As ``parallel --halt now,success=1``: the first task done is what was asked for."""
    tasks, farm_dir = node.root / "tasks.txt", node.root / "f"
    tasks.write_text(f"{client(node, 30)}\ntrue\n{client(node, 30)}\n")
    args = ("farm", "--per-gpu", "3", "--halt", "now,success=1", "--grace", "3")
    res = node.run(*args, "--dir", str(farm_dir), str(tasks), timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    statuses = {r["task"]: r["status"] for r in records(farm_dir)}
    assert statuses == {0: "interrupted", 1: "done", 2: "interrupted"}, statuses


def test_a_failed_task_waiting_for_its_verdict_no_longer_counts_as_running(
    node: SimNode,
) -> None:
    tasks, farm_dir = node.root / "tasks.txt", node.root / "f"
    tasks.write_text("exit 3\nsleep 2\nsleep 2 # b\nsleep 2 # c\n")
    args = ("farm", "--gpus", "0", "--per-gpu", "2", "--progress", "lines", "--heartbeat", "0.2")
    res = node.run(*args, "--dir", str(farm_dir), str(tasks), timeout=60)
    assert res.returncode == 1, res.stderr
    counts = [int(m[1]) for m in re.finditer(r"finished .*?(\d+) running", res.stderr)]
    assert counts and max(counts) <= 2, res.stderr  # K=2: never 3 running
    tally = fold(read_journal(farm_dir)["state.jsonl"])
    assert not tally.running and not tally.settling and tally.failed == 1 and tally.done == 3


def test_halt_now_ends_the_running_tasks_as_interrupted(node: SimNode) -> None:
    tasks, farm_dir = node.root / "tasks.txt", node.root / "f"
    tasks.write_text(f"{client(node, 30)}\nsleep 0.5; exit 5\n{client(node, 30)}\n")
    args = ("farm", "--per-gpu", "3", "--halt", "now,fail=1", "--grace", "3")
    res = node.run(*args, "--dir", str(farm_dir), str(tasks), timeout=60)
    assert res.returncode == 1, res.stderr
    statuses = {r["task"]: r["status"] for r in records(farm_dir)}
    assert statuses == {0: "interrupted", 1: "failed", 2: "interrupted"}, statuses
    assert halts(farm_dir) == ["--halt now,fail=1"]  # once: its stop is no second halt
    # The summary lists them as what they were, not as tasks that never ran.
    assert "  interrupted: task 0: " in res.stdout and "  interrupted: task 2: " in res.stdout
    assert "not run: task" not in res.stdout, res.stdout
    rows = [ln.split("\t") for ln in (farm_dir / "joblog").read_text().splitlines()[1:]]
    # Exitval and Signal agree: 128+N and N after a signal, whatever ended the task.
    assert all(int(r[7]) == max(0, int(r[6]) - 128) for r in rows), rows


def test_a_task_past_its_timeout_is_signal_15_in_the_joblog(node: SimNode) -> None:
    """As ``parallel --timeout`` writes it, also where a SIGKILL stood in for the TERM that
    the shield ignores."""
    tasks, farm_dir = node.root / "tasks.txt", node.root / "f"
    tasks.write_text("sleep 30\ntrue\n")
    args = ("farm", "--gpus", "0", "--per-gpu", "2", "--timeout", "0.5", "--grace", "1")
    res = node.run(*args, "--dir", str(farm_dir), str(tasks), timeout=60)
    assert res.returncode == 1, res.stderr
    rows = [ln.split("\t") for ln in (farm_dir / "joblog").read_text().splitlines()[1:]]
    assert {r[0]: (r[6], r[7]) for r in rows} == {"1": ("143", "15"), "2": ("0", "0")}, rows
    # The shell's child `sleep`, ended by the same SIGKILL, is no leftover to warn about.
    assert "left" not in res.stderr, res.stderr


def test_timeout_ends_a_task_through_terminate_client_and_records_it(node: SimNode) -> None:
    rec = node.root / "rec.jsonl"
    tasks, farm_dir = node.root / "tasks.txt", node.root / "f"
    tasks.write_text(f"{client(node, 60)} --record {rec} --tag t\ntrue\n")
    args = ("farm", "--per-gpu", "2", "--timeout", "1.5", "--grace", "3", "--dir", str(farm_dir))
    start = time.monotonic()
    res = node.run(*args, str(tasks), timeout=60)
    assert time.monotonic() - start < 30
    assert res.returncode == 1, res.stderr
    final = {r["task"]: r for r in records(farm_dir)}
    assert final[0]["status"] == "timeout" and final[1]["status"] == "done"
    assert final[0]["end"] - final[0]["start"] < 10
    ends = [json.loads(ln) for ln in rec.read_text().splitlines()]
    assert [e.get("reason") for e in ends if e["event"] == "end"] == ["terminated"]
    assert "task 0 timed out" in res.stderr and "1 timed out" in res.stdout
    # Signal 15 past --timeout, as the joblog's readers look for, whether the CUDA task exited
    # on its own once terminate_client ended its client (1) or the SIGTERM that follows came
    # first (143: the shield's stand-in), as a busy machine decides.
    rows = [ln.split("\t") for ln in (farm_dir / "joblog").read_text().splitlines()[1:]]
    ended = {r[0]: (r[6], r[7]) for r in rows}
    assert ended.pop("2") == ("0", "0") and ended["1"] in {("1", "15"), ("143", "15")}, rows


def test_resume_reruns_failed_tasks_unless_skip_failed(node: SimNode) -> None:
    tasks, farm_dir = node.root / "tasks.txt", node.root / "f"
    tasks.write_text("true\nexit 3\n")
    args = ("farm", "--dir", str(farm_dir), str(tasks))
    assert node.run(*args, timeout=60).returncode == 1
    again = node.run(*args, timeout=60)
    assert again.returncode == 1 and "1 done before" in again.stdout, again.stdout
    assert [r["task"] for r in records(farm_dir)] == [0, 1, 1]
    skipped = node.run(*args[:-1], "--skip-failed", str(tasks), timeout=60)
    # Not run again, and still failed: a script's `farm ... && next` does not go on.
    assert skipped.returncode == 1, skipped.stdout + skipped.stderr
    said = "nothing to run: 2 tasks, 1 done before, 1 failed before (--skip-failed)"
    assert said in skipped.stdout, skipped.stdout
    assert [r["task"] for r in records(farm_dir)] == [0, 1, 1]
    tasks.write_text("true\nexit 3\ntrue # new\n")
    new = node.run(*args[:-1], "--skip-failed", str(tasks), timeout=60)
    assert new.returncode == 1, new.stdout + new.stderr
    assert "3 tasks: 1 done, 0 failed, 0 not run, 1 done before, 1 failed before" in new.stdout
    assert [r["task"] for r in records(farm_dir)] == [0, 1, 1, 2]
    status = node.run("farm", "status", str(farm_dir), timeout=60)
    assert "1 failed before" in status.stdout, status.stdout


def test_heartbeat_lines_and_quiet_prints_only_problems(node: SimNode) -> None:
    tasks, farm_dir = node.root / "tasks.txt", node.root / "f"
    tasks.write_text("sleep 2\nexit 6\n")
    args = ("farm", "--per-gpu", "2", "--heartbeat", "0.5", "--dir", str(farm_dir), str(tasks))
    res = node.run(*args, timeout=60)
    beats = [ln for ln in res.stderr.splitlines() if re.match(r"mpswrap: farm: \d+/2 finished", ln)]
    assert beats and all("running" in ln for ln in beats), res.stderr
    assert any("1 running" in ln for ln in beats), beats
    (farm_dir / "state.jsonl").unlink()
    quiet = node.run("-q", *args, timeout=60)
    assert quiet.returncode == 1
    assert "task 1 failed (exit 6)" in quiet.stderr, quiet.stderr
    assert "finished" not in quiet.stderr and "summary: node" in quiet.stderr
    assert "failed: task 1 (exit 6, failed)" in quiet.stdout
    (farm_dir / "state.jsonl").unlink()
    clean = node.run("-q", "farm", "--dir", str(farm_dir), str(node.root / "ok.txt"), timeout=60)
    assert clean.returncode == 2  # no such list: a usage error still says so
    (node.root / "ok.txt").write_text("true\n")
    clean = node.run("-q", "farm", "--dir", str(farm_dir), str(node.root / "ok.txt"), timeout=60)
    assert clean.returncode == 0 and clean.stdout == "" and clean.stderr == "", clean


def test_status_lists_failed_tasks_every_farm_here_and_json(node: SimNode) -> None:
    for name, lines in (("a.txt", "true\nexit 3\n"), ("b.txt", "true\n")):
        (node.root / name).write_text(lines)
        node.run("farm", name, timeout=60)
    status = node.run("farm", "status", timeout=30)
    assert status.returncode == 0, status.stderr
    assert "farm a.txt.farm: ended" in status.stdout and "farm b.txt.farm: ended" in status.stdout
    assert re.search(r"failed: task 1 \(exit 3, failed\): exit 3  log: \S+\.err", status.stdout)
    failed = node.run("farm", "status", "--failed", "a.txt.farm", timeout=30)
    assert failed.stdout.startswith("task 1 (exit 3, failed): exit 3  log: "), failed.stdout
    data = json.loads(node.run("farm", "status", "--json", "a.txt.farm", timeout=30).stdout)
    assert data["failed"] == 1 and data["shares"][0]["failed_tasks"][0]["code"] == 3
    every = json.loads(node.run("farm", "status", "--json", timeout=30).stdout)
    assert [f["directory"] for f in every["farms"]] == ["a.txt.farm", "b.txt.farm"]
    (node.root / "c.txt.farm" / "logs").mkdir(parents=True)  # a farm that never started
    passed = node.run("farm", "status", timeout=30)
    assert passed.returncode == 0, passed.stderr
    assert "farm a.txt.farm: ended" in passed.stdout and "farm b.txt.farm: ended" in passed.stdout
    assert "passed over: not a farm directory (no state file) (c.txt.farm)" in passed.stderr
    asked = node.run("farm", "status", "c.txt.farm", timeout=30)
    assert asked.returncode == 2 and "not a farm directory" in asked.stderr, asked.stderr


@pytest.mark.parametrize("source", ["/dev/zero", "."])
def test_a_task_list_that_is_no_list_is_refused(node: SimNode, source: str) -> None:
    res = node.run("farm", "--dir", str(node.root / "f"), source, timeout=30)
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines()[0].startswith("mpswrap: cannot read the task list"), res.stderr
    assert "larger than 256 MiB" in res.stderr or "not a file, a pipe" in res.stderr


@pytest.mark.parametrize("source", ["/dev/null", "-"])
def test_an_empty_device_is_an_empty_list(node: SimNode, source: str) -> None:
    """As ``parallel -a /dev/null``: no tasks, nothing refused (``-`` is standard input,
    /dev/null here)."""
    res = subprocess.run(
        [*node_argv(), "farm", "--dir", str(node.root / "f"), source],
        env=node.env(),
        cwd=node.root,
        stdin=subprocess.DEVNULL,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "no tasks to run" in res.stdout + res.stderr, res.stdout + res.stderr


def test_a_named_pipe_is_read_once_its_writer_comes(node: SimNode) -> None:
    """As ``cat fifo``: a farm waits for the pipe's writer instead of reading it as empty."""
    fifo = node.root / "tasks.fifo"
    os.mkfifo(fifo)
    proc = node.start("farm", "--dir", str(node.root / "f"), str(fifo))
    with open(fifo, "w") as writer:  # opens once the farm has; the farm waits till then
        writer.write("true\ntrue\n")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "2 tasks: 2 done" in out, out + err


def test_a_task_list_from_a_pipe_is_read(node: SimNode) -> None:
    read, write = os.pipe()
    os.write(write, b"true\ntrue\n")
    os.close(write)
    res = subprocess.run(
        [*node_argv(), "farm", "--dir", "p", f"/dev/fd/{read}"],
        env=node.env(),
        cwd=node.root,
        text=True,
        capture_output=True,
        timeout=60,
        pass_fds=(read,),
    )
    os.close(read)
    assert res.returncode == 0 and "2 tasks: 2 done" in res.stdout, res.stderr
    assert (node.root / "p" / "state.jsonl").is_file()
    # Without --dir, a pipe's path (bash's <(...)) is no place for a directory: stdin.farm.
    bash = ["bash", "-c", 'exec "$@" <(printf "true\\n")', "bash", *node_argv(), "farm"]
    res = subprocess.run(
        bash, env=node.env(), cwd=node.root, text=True, capture_output=True, timeout=60
    )
    assert res.returncode == 0 and "1 task: 1 done" in res.stdout, res.stderr
    assert (node.root / "stdin.farm" / "state.jsonl").is_file()


def node_argv() -> list[str]:
    from tests.simenv import MPSWRAP

    return list(MPSWRAP)


def test_a_farm_whose_output_closed_still_ends_its_journal(node: SimNode) -> None:
    """``mpswrap farm tasks.txt | head -1``: every task runs, the journal is whole (its end
    recorded with the code the farm exits), and the farm exits 141 as a program whose reader
    left does; a failed task changes neither."""
    (node.root / "t.txt").write_text("true\ntrue\nexit 2\n")
    res = node.run_unread("farm", "--tag", "--dir", "f", "t.txt")
    assert res.returncode == 141, res.stderr
    tally = fold(read_journal(node.root / "f")["state.jsonl"])
    assert (tally.code, tally.done, tally.failed) == (141, 2, 1), tally
    status = node.run("farm", "status", "f", timeout=30)
    assert "exit code 141" in status.stdout, status.stdout


@pytest.mark.parametrize("share_first", [True, False])
def test_status_settles_each_task_across_share_layouts_as_a_farm_run_again_does(
    node: SimNode, share_first: bool
) -> None:
    """A task that failed in one ``--share`` layout's journal and was done since by a farm of
    another is done for ``farm status`` as for the farm itself; the totals count tasks."""
    (node.root / "tasks.txt").write_text("test -e flag\necho b\necho c\n")
    farm = ("farm", "-qq", "--per-gpu", "1")
    shares = [(*farm, "--gpus", str(i), "--share", f"{i}/2", "tasks.txt") for i in (0, 1)]
    whole = (*farm, "--gpus", "0", "tasks.txt")
    first, then = (shares, [whole]) if share_first else ([whole], shares)
    for args in first:  # task 0 fails: no flag yet
        node.run(*args, timeout=60)
    (node.root / "flag").touch()
    for args in then:
        node.run(*args, timeout=60)
    again = node.run(*whole, timeout=60)
    assert again.returncode == 0, again.stderr  # nothing to run: all done
    failed = node.run("farm", "status", "--failed", "tasks.txt", timeout=30)
    assert (failed.returncode, failed.stdout) == (0, ""), failed
    data = json.loads(node.run("farm", "status", "--json", "tasks.txt", timeout=30).stdout)
    assert (data["tasks"], data["failed"], data["not_run"]) == (3, 0, 0), data
    assert data["done"] + data["done_before"] == 3, data
    text = node.run("farm", "status", "tasks.txt", timeout=30).stdout
    assert "failed: task" not in text and ", 1 failed" not in text, text
