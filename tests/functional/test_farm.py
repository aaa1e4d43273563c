"""``mpswrap farm`` and ``mpswrap calibrate`` as users run them, against the MPS simulator.

Every task is a simulated client that records how it started and ended (``--record``), tagged
with its ``MPSWRAP_TASK``; every test fails if a daemon, server or client survives it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.functional.test_launcher import by_tag, records
from tests.procs import signal_tree
from tests.simenv import SimNode
from tests.waits import wait_until

pytestmark = pytest.mark.functional


def state(farm_dir: Path) -> list[dict[str, Any]]:
    """The finished attempts of the state files (not the farm's events)."""
    lines: list[dict[str, Any]] = []
    for path in sorted(farm_dir.glob("state*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return [line for line in lines if "event" not in line]


def task_line(node: SimNode, rec: Path, seconds: float, extra: str = "") -> str:
    return f'{node.client} --seconds {seconds} --record {rec} --tag "$MPSWRAP_TASK" {extra}'


def forty_tasks(node: SimNode, rec: Path) -> Path:
    """40 tasks: task 7 fails on its own (exit 3); task 20 causes a fatal GPU fault on its
    first run only, which ends every client of its GPU's server."""
    mark = node.root / "faulted-once"
    lines = [task_line(node, rec, 0.4) for _ in range(40)]
    lines[7] = "echo task seven fails >&2; exit 3"
    lines[20] = (
        f"if [ -e {mark} ]; then {task_line(node, rec, 0.4)}; else touch {mark}; "
        f"{task_line(node, rec, 5, '--fault-after 0.6')}; fi"
    )
    tasks = node.root / "tasks.txt"
    tasks.write_text("# forty tasks\n\n" + "\n".join(lines) + "\n")
    return tasks


def test_forty_tasks_on_two_gpus_retry_only_the_faulted_and_resume_only_the_failed(
    node: SimNode,
) -> None:
    rec, farm_dir = node.root / "rec.jsonl", node.root / "farm"
    tasks = forty_tasks(node, rec)
    args = ("farm", "--per-gpu", "3", "--dir", str(farm_dir), "--progress", "lines", str(tasks))
    res = node.run(*args, timeout=180)
    assert res.returncode == 1, res.stderr
    attempts = state(farm_dir)
    final = {r["task"]: r for r in attempts}
    assert sorted(final) == list(range(40))
    assert {t for t, r in final.items() if r["status"] != "done"} == {7}
    assert [(r["attempt"], r["status"], r["code"]) for r in attempts if r["task"] == 7] == [
        (1, "failed", 3)
    ]
    faulted = [r for r in attempts if r["status"] == "fault"]
    assert 20 in {r["task"] for r in faulted}, attempts
    # Only the clients of the faulted GPU's server were hit, each retried once and done.
    assert len({r["gpu"] for r in faulted}) == 1
    for record in faulted:
        retried = [r for r in attempts if r["task"] == record["task"] and r["attempt"] == 2]
        assert [r["status"] for r in retried] == ["done"], record
    assert all(r["attempt"] <= 2 for r in attempts)
    # K=3 per GPU at most, each task one MPS client of its GPU's daemon.
    starts = [r for r in records(rec) if r["event"] == "start"]
    assert all(r["mode"] == "mps" for r in starts)
    assert Counter(Path(r["pipe"]).parent.name for r in starts).keys() == {"g0", "g1"}
    assert _most_at_once(records(rec)) <= 6
    # Logs per task and attempt; the summary names the failed task and its log.
    logs = farm_dir / "logs"
    first = [
        p.name for p in logs.iterdir() if re.fullmatch(r"\d{4}-[0-9a-f]{8}(-\d+)?\.out", p.name)
    ]
    assert sorted(int(name[:4]) for name in first) == list(range(40))
    assert "task seven fails" in one(logs.glob("0007-*.err")).read_text()
    assert one(logs.glob("0020-*.2.out")).exists()
    assert "39 done, 1 failed, 0 not run" in res.stdout, res.stdout
    assert "task 7 (exit 3, failed): echo task seven fails" in res.stdout
    assert "task 7 failed (exit 3)" in res.stderr
    assert not any(node.user_run_dir.glob("*/*")), "the farm's daemons must be gone"

    again = node.run(*args, timeout=120)
    assert again.returncode == 1, again.stderr
    new = state(farm_dir)[len(attempts) :]
    assert [(r["task"], r["status"]) for r in new] == [(7, "failed")]
    assert "39 done before" in again.stdout, again.stdout


def one(paths: Any) -> Path:
    found = list(paths)
    assert len(found) == 1, found
    return Path(found[0])


def _most_at_once(recs: list[dict[str, Any]]) -> int:
    """The most clients alive at one moment, from their start and end records."""
    events = sorted((r["time"], 1 if r["event"] == "start" else -1) for r in recs)
    alive = most = 0
    for _, step in events:
        alive += step
        most = max(most, alive)
    return most


def test_sigterm_mid_farm_ends_every_task_through_terminate_client_and_leaves_nothing(
    node: SimNode,
) -> None:
    rec, farm_dir = node.root / "rec.jsonl", node.root / "farm"
    tasks = node.root / "tasks.txt"
    tasks.write_text("\n".join(task_line(node, rec, 60) for _ in range(10)) + "\n")
    proc = node.start("farm", "--per-gpu", "2", "--grace", "5", "--dir", str(farm_dir), str(tasks))
    wait_until(lambda: len(by_tag(records(rec), "start")) == 4, 30, "4 tasks started")
    assert signal_tree(proc, signal.SIGTERM) >= 5
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    ends = [r["reason"] for r in records(rec) if r["event"] == "end"]
    assert ends == ["terminated"] * 4, ends
    # The four that ran are recorded as interrupted (they were, by the signal), not as done or
    # failed: all ten run again next time.
    interrupted = state(farm_dir)
    assert [r["status"] for r in interrupted] == ["interrupted"] * 4, interrupted
    assert "4 interrupted, 6 not run" in out, out
    # The node's summary line says what the farm's does: four tasks, ended through MPS.
    node_line = next(ln for ln in err.splitlines() if "summary: node" in ln)
    assert ": 4 tasks, " in node_line and " 4 ended by terminate_client" in node_line, node_line
    # Not settled: no joblog line (parallel's --resume would take one as done).
    assert (farm_dir / "joblog").read_text().splitlines()[1:] == []
    assert not any(node.user_run_dir.glob("*/*"))


def test_a_farm_killed_outright_has_its_tasks_ended_by_their_guards(node: SimNode) -> None:
    rec, farm_dir = node.root / "rec.jsonl", node.root / "farm"
    tasks = node.root / "tasks.txt"
    tasks.write_text("\n".join(task_line(node, rec, 60) for _ in range(4)) + "\n")
    proc = node.start("farm", "--per-gpu", "1", "--dir", str(farm_dir), str(tasks))
    wait_until(lambda: len(by_tag(records(rec), "start")) == 2, 30, "2 tasks started")
    proc.kill()
    proc.communicate(timeout=30)
    wait_until(
        lambda: len([r for r in records(rec) if r["event"] == "end"]) == 2, 30, "2 tasks ended"
    )
    assert [r["reason"] for r in records(rec) if r["event"] == "end"] == ["terminated"] * 2
    # The daemons' owner is gone: its watchdog stops them in time; stop does it now.
    res = node.run("stop", "--job", f"farm-{proc.pid}", timeout=60)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(
    ("extra", "share_env", "picked", "state_name"),
    [
        (
            (),
            {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "3"},
            [1, 4],
            "state-1of3.jsonl",
        ),
        (("--share", "0/2"), {}, [0, 2, 4], "state-0of2.jsonl"),
        (
            (),
            {"SLURM_STEP_ID": "batch", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"},
            [0, 1, 2, 3, 4],
            "state.jsonl",
        ),
    ],
)
def test_a_share_runs_its_tasks_only_and_keeps_its_own_state_file(
    node: SimNode,
    extra: tuple[str, ...],
    share_env: dict[str, str],
    picked: list[int],
    state_name: str,
) -> None:
    rec, farm_dir = node.root / "rec.jsonl", node.root / "farm"
    tasks = node.root / "tasks.txt"
    tasks.write_text("\n".join(task_line(node, rec, 0.1) for _ in range(5)) + "\n")
    res = node.run("farm", *extra, "--dir", str(farm_dir), str(tasks), **share_env)  # type: ignore[arg-type]
    assert res.returncode == 0, res.stderr
    assert sorted(int(t) for t in by_tag(records(rec), "start")) == picked
    assert [p.name for p in farm_dir.glob("state*.jsonl")] == [state_name]


def test_tasks_from_stdin_and_the_python_api(node: SimNode) -> None:
    rec = node.root / "rec.jsonl"
    lines = [task_line(node, rec, 0.1) for _ in range(3)]
    res = subprocess.run(
        [sys.executable, "-m", "mpswrap", "farm", "--dir", "f", "-"],
        input="\n".join(lines),
        env=node.env(),
        cwd=node.root,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "3 done, 0 failed" in res.stdout
    code = (
        "import logging, mpswrap, sys; logging.basicConfig(level=logging.INFO, "
        "format='%(name)s: %(message)s'); "
        "r = mpswrap.farm(sys.argv[1:], directory='api', per_gpu=2, progress='lines'); "
        "print('result', r.code, [(x.status, x.code) for x in r.records], file=sys.stderr); "
        "sys.exit(r.code)"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, *lines, "exit 5"],
        env=node.env(),
        cwd=node.root,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 1, res.stderr
    assert res.stdout == ""  # the library prints nothing: it returns, and logs
    assert "result 1" in res.stderr and res.stderr.count("('done', 0)") == 3, res.stderr
    assert "('failed', 5)" in res.stderr, res.stderr
    logged = [ln for ln in res.stderr.splitlines() if ln.startswith("mpswrap.entry.farm: ")]
    assert any("farm: 4 tasks: 3 done, 1 failed, 0 not run" in ln for ln in logged), logged
    assert any("farm: task 3 failed (exit 5)" in ln for ln in logged), logged


def test_calibrate_times_each_count_time_sliced_and_under_mps(node: SimNode) -> None:
    rec = node.root / "rec.jsonl"
    res = node.run(
        "calibrate",
        "--counts",
        "1,2",
        "--repeats",
        "1",
        "--json",
        "--dir",
        str(node.root / "cal"),
        "--",
        "sh",
        "-c",
        task_line(node, rec, 0.3),
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    configs = [(r["copies"], r["mode"]) for r in report["rows"]]
    modes = ["time-sliced", "mps", "mps-200/n"]
    assert configs == [(c, m) for c in (1, 2) for m in modes]
    assert report["recommended"]["mode"] in modes[1:]
    starts = [r for r in records(rec) if r["event"] == "start"]
    assert Counter(r["mode"] for r in starts) == {"non-mps": 3, "mps": 6}
    assert not (node.root / "cal").exists()  # no copy failed: what it made is gone
    mine = node.root / "results"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    res = node.run(
        "calibrate",
        "--counts",
        "1",
        "--repeats",
        "1",
        "--dir",
        str(mine),
        "--",
        node.client,
        "--seconds",
        "0.1",
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert [p.name for p in mine.iterdir()] == ["keep.txt"]  # only its own runs removed
    table = node.run(
        "calibrate",
        "--counts",
        "1",
        "--repeats",
        "1",
        "--",
        node.client,
        "--seconds",
        "0.1",
        timeout=60,
    )
    assert table.returncode == 0, table.stderr
    # One copy under MPS costs the simulated client's attach: where MPS loses to time-slicing
    # calibrate says so and recommends running without it, naming the MPS choice still.
    assert "recommended: " in table.stdout and "--per-gpu 1 --threads" in table.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("farm", "/nonexistent/tasks.txt"), "cannot read the task list"),
        (("farm", "--per-gpu", "0", "t"), "argument --per-gpu: invalid value '0'"),
        (("farm", "--share", "2/2", "t"), "argument --share: invalid value '2/2'"),
        (("farm", "--retries", "-1", "t"), "argument --retries: invalid value '-1'"),
        (("calibrate", "--counts", "0,x", "--", "true"), "argument --counts: invalid value"),
        (("calibrate", "--"), "no command to calibrate"),
    ],
)
def test_bad_farm_input_is_one_line_and_exit_2(
    node: SimNode, args: tuple[str, ...], says: str
) -> None:
    res = node.run(*args)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(f"mpswrap: {says}") or f"mpswrap: {says}" in res.stderr
    assert len([ln for ln in res.stderr.splitlines() if not ln.startswith("hint")]) == 1
    assert not any(node.user_run_dir.glob("*/*"))


@pytest.mark.parametrize(
    ("third", "says"),
    [
        (b"echo 'open", "tasks.txt:3: bad task: No closing quotation"),
        (b"echo a\0b", "tasks.txt:3: the line has a NUL byte"),
        (b"echo \xff\xfe", "tasks.txt:3: the line is not UTF-8 text (byte 0xff at column 6)"),
        (b"echo " + b"x" * 70000, "tasks.txt:3: the line is longer than 64 KiB (70005 bytes)"),
    ],
)
def test_a_bad_task_line_is_one_line_naming_it_before_any_daemon_starts(
    node: SimNode, third: bytes, says: str
) -> None:
    (node.root / "tasks.txt").write_bytes(b"true\n# fine\n" + third + b"\ntrue\n")
    res = node.run("farm", "tasks.txt")
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines()[0] == f"mpswrap: {says}", res.stderr
    assert [ln for ln in res.stderr.splitlines() if not ln.startswith("hint: ")] == [
        f"mpswrap: {says}"
    ]
    assert not (node.root / "tasks.txt.farm").exists()
    assert not any(node.user_run_dir.glob("*/*")), "no daemon may have started"


def test_running_again_with_everything_done_starts_nothing(node: SimNode) -> None:
    tasks = node.root / "tasks.txt"
    tasks.write_text("true\ntrue\n")
    first = node.run("farm", "--dir", str(node.root / "f"), str(tasks), PATH=os.environ["PATH"])
    assert first.returncode == 0, first.stderr
    again = node.run("farm", "--dir", str(node.root / "f"), str(tasks), PATH=os.environ["PATH"])
    assert again.returncode == 0 and "nothing to run: 2 tasks, all done before" in again.stdout
    assert "started MPS daemon" not in again.stderr


def test_calibrate_saves_a_plot_and_without_matplotlib_refuses_before_running(
    node: SimNode,
) -> None:
    png = node.root / "calibrate.png"
    argv = [
        "calibrate",
        "--counts",
        "1,2",
        "--repeats",
        "1",
        "--plot",
        str(png),
        "--",
        node.client,
        "--seconds",
        "0.1",
    ]
    res = node.run(*argv, timeout=120)
    assert res.returncode == 0, res.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    png.unlink()
    hide = (
        "import sys; sys.modules['matplotlib'] = None; from mpswrap.cli.main import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    res = subprocess.run(
        [sys.executable, "-c", hide, *argv],
        env=node.env(),
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 2 and "mpswrap: --plot needs matplotlib" in res.stderr, res.stderr
    assert "started MPS daemon" not in res.stderr and not png.exists()


def test_a_task_that_exits_0_when_the_farm_is_stopped_is_not_recorded_as_done(
    node: SimNode,
) -> None:
    farm_dir, ready = node.root / "farm", node.root / "ready"
    ready.mkdir()
    script = (
        f"import os, signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: "
        f"sys.exit(0)); open('{ready}/' + os.environ['MPSWRAP_TASK'], 'w').close(); "
        f"time.sleep(60)"
    )
    tasks = node.root / "tasks.txt"
    tasks.write_text(f'{sys.executable} -c "{script}"\n' * 2)
    proc = node.start("farm", "--per-gpu", "1", "--dir", str(farm_dir), str(tasks))
    wait_until(lambda: len(list(ready.iterdir())) == 2, 30, "2 tasks ready")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    # Recorded as interrupted (a stop ended them), never as done: both run again next time.
    assert [r["status"] for r in state(farm_dir)] == ["interrupted"] * 2, out
    assert "2 interrupted, 0 not run" in out, out


def test_a_second_farm_on_the_same_directory_is_refused(node: SimNode) -> None:
    rec, farm_dir = node.root / "rec.jsonl", node.root / "farm"
    tasks = node.root / "tasks.txt"
    tasks.write_text(task_line(node, rec, 30) + "\n")
    first = node.start("farm", "--dir", str(farm_dir), str(tasks))
    wait_until(lambda: len(records(rec)) == 1, 30, "one record")
    second = node.run("farm", "--dir", str(farm_dir), str(tasks))
    assert second.returncode == 2, second.stderr
    assert "mpswrap: another farm runs in this directory" in second.stderr
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=60)
    assert first.returncode == 128 + signal.SIGINT


def test_a_task_sees_no_rank_of_the_step_that_runs_the_farm(node: SimNode) -> None:
    tasks = node.root / "tasks.txt"
    tasks.write_text("env\n")
    step = {
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_STEP_NUM_TASKS": "1",
        "SLURM_NTASKS": "1",
        "SLURM_LOCALID": "0",
    }
    res = node.run("farm", "--dir", str(node.root / "f"), str(tasks), **step)  # type: ignore[arg-type]
    assert res.returncode == 0, res.stderr
    seen = one((node.root / "f" / "logs").glob("0000-*.out")).read_text()
    assert "MPSWRAP_TASK=0" in seen and "MPSWRAP_TASK_ATTEMPT=1" in seen
    assert not any(f"{name}=" in seen for name in step if name != "SLURM_STEP_ID"), seen


def test_calibrate_refuses_more_copies_than_the_gpu_takes_and_leaves_nothing(
    node: SimNode,
) -> None:
    res = node.run("calibrate", "--counts", "1,49", "--", "true")
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines()[-1] == (
        "mpswrap: --counts asks for more clients than the GPU takes (49): its limit is 48"
    )
    assert not any(node.user_run_dir.glob("*/*"))


# --- issue 31: what GNU parallel and HyperQueue users expect ------------------------------
def test_progress_lines_count_what_runs_when_they_are_printed(node: SimNode) -> None:
    """Ten places for ten tasks: all start at once. A line for each task; the last line of a
    wake says where the farm stands once the tasks that exited together are reaped, so its
    running count is exactly the tasks not finished (never a stale count); the last says 0.
    A busy machine may reap two tasks in one wake: then only the second line says it."""
    rec, farm_dir = node.root / "rec.jsonl", node.root / "farm"
    tasks = node.root / "tasks.txt"
    tasks.write_text("".join(task_line(node, rec, 0.2 + 0.4 * i) + "\n" for i in range(10)))
    args = ("farm", "--per-gpu", "5", "--progress", "lines", "--dir", str(farm_dir), str(tasks))
    res = node.run(*args, timeout=120)
    assert res.returncode == 0, res.stderr
    done_lines = re.findall(r"^mpswrap: farm: task (\d+) done \(", res.stderr, re.M)
    assert sorted(map(int, done_lines)) == list(range(10)), res.stderr
    found = [
        (int(done), int(running))
        for done, running in re.findall(
            r"\[(\d+)/10 finished \(\d+ done, \d+ failed\), (\d+) running", res.stderr
        )
    ]
    assert all(done + running == 10 for done, running in found), res.stderr
    assert len(found) > 1, res.stderr  # not all reaped at once: the counts were tested
    assert found[-1] == (10, 0)


def test_every_line_is_a_shell_command_line(node: SimNode) -> None:
    rec, farm_dir = node.root / "rec.jsonl", node.root / "farm"
    tasks = node.root / "tasks.txt"
    tasks.write_text(
        f"exit 5\nno-such-program-mpswrap --seed 1\n{node.client} --seconds 0.1 --record {rec}\n"
    )
    res = node.run("farm", "--progress", "lines", "--dir", str(farm_dir), str(tasks))
    assert res.returncode == 1, res.stderr
    codes = {r["task"]: (r["status"], r["code"]) for r in state(farm_dir)}
    assert codes == {0: ("failed", 5), 1: ("failed", 127), 2: ("done", 0)}, codes
    err = one((farm_dir / "logs").glob("0001-*.err")).read_text()
    assert "no-such-program-mpswrap" in err and "not found" in err, err
    assert "task 1 failed (exit 127: command not found)" in res.stderr, res.stderr
    assert "task 1 (exit 127: command not found, failed): no-such-program" in res.stdout
    assert [r["mode"] for r in records(rec) if r["event"] == "start"] == ["mps"]


@pytest.mark.parametrize("prefix", ["", "true && "])
def test_a_tasks_client_under_its_shell_is_ended_through_terminate_client(
    node: SimNode, prefix: str
) -> None:
    rec, farm_dir = node.root / "rec.jsonl", node.root / "farm"
    tasks = node.root / "tasks.txt"
    tasks.write_text(f"{prefix}{node.client} --seconds 60 --record {rec}\n" * 2)
    proc = node.start("farm", "--per-gpu", "1", "--grace", "5", "--dir", str(farm_dir), str(tasks))
    wait_until(lambda: len(_started(rec)) == 2 or None, 30, "2 tasks started")
    pids = [r["pid"] for r in _started(rec)]
    for pid in pids:  # the task's process is the shell; the MPS client is its child
        parent = psutil.Process(pid).parent()
        assert parent is not None and parent.cmdline()[:2] == ["/bin/sh", "-c"], parent
    assert signal_tree(proc, signal.SIGTERM) >= 5
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert [r["reason"] for r in records(rec) if r["event"] == "end"] == ["terminated"] * 2
    assert "2 interrupted, 0 not run" in out, out
    assert not any(node.user_run_dir.glob("*/*"))


def test_farm_status_from_another_shell_while_it_runs_and_after(node: SimNode) -> None:
    rec, farm_dir = node.root / "rec.jsonl", node.root / "tasks.txt.farm"
    gate = node.root / "go"
    quick = task_line(node, rec, 0.2)
    held = f"while [ ! -e {gate} ]; do sleep 0.05; done; {task_line(node, rec, 0.1)}"
    (node.root / "tasks.txt").write_text(f"# four\n{quick}\n{quick}\n{held}\n{held}\n{quick}\n")
    proc = node.start("farm", "--per-gpu", "1", "--progress", "off", "tasks.txt")
    wait_until(lambda: len(state(farm_dir)) == 2 or None, 60, "the first two done")
    wait_until(lambda: _starts(farm_dir) == 4 or None, 30, "tasks 2 and 3 started")
    shown = node.run("farm", "status", "tasks.txt.farm")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"farm tasks.txt.farm: running on node {_node(farm_dir)}")
    assert lines[1].startswith("  5 tasks: 2 done, 0 failed, 2 running, 1 not run"), lines
    assert "ETA" in lines[1], lines
    running = sorted(ln for ln in lines if ln.startswith("  running:"))
    assert [ln.split(",")[0] for ln in running] == [
        "  running: task 2 (line 4) on gpu 0",
        "  running: task 3 (line 5) on gpu 1",
    ] or [ln.split(",")[0] for ln in running] == [
        "  running: task 2 (line 4) on gpu 1",
        "  running: task 3 (line 5) on gpu 0",
    ], lines
    data = json.loads(node.run("farm", "status", "--json", "tasks.txt").stdout)
    assert (data["done"], data["running"], data["not_run"], data["failed"]) == (2, 2, 1, 0)
    assert sorted(t["line"] for t in data["shares"][0]["running_tasks"]) == [4, 5]
    assert data["shares"][0]["state"] == "running" and data["shares"][0]["eta_s"] is not None
    gate.touch()
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    after = node.run("farm", "status")  # the one *.farm here
    assert after.returncode == 0, after.stderr
    assert "ended" in after.stdout and "exit code 0" in after.stdout, after.stdout
    assert "5 tasks: 5 done, 0 failed, 0 running, 0 not run" in after.stdout


def _starts(farm_dir: Path) -> int:
    path = farm_dir / "state.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return sum('"event": "start"' in line for line in lines)


def _node(farm_dir: Path) -> str:
    head = json.loads((farm_dir / "state.jsonl").read_text().splitlines()[0])
    assert head["event"] == "farm"
    return str(head["node"])


def test_farm_status_refuses_what_is_no_farm_and_a_list_named_status_still_runs(
    node: SimNode,
) -> None:
    missing = node.run("farm", "status", "nowhere.farm")
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr.splitlines()[0] == "mpswrap: no such farm directory (nowhere.farm)"
    (node.root / "empty").mkdir()
    foreign = node.run("farm", "status", "empty")
    assert foreign.returncode == 2
    assert foreign.stderr.startswith("mpswrap: not a farm directory (no state file) (empty)")
    which = node.run("farm", "status")
    # Without DIR: every farm here; none is a usage error.
    assert which.returncode == 2 and "no farm here" in which.stderr, which.stderr
    fifo = node.root / "fifo.farm"
    fifo.mkdir()
    os.mkfifo(fifo / "state.jsonl")  # never opened for reading blocking, never read
    stuck = node.run("farm", "status", "fifo.farm", timeout=20)
    assert stuck.returncode == 2, stuck.stderr
    assert "mpswrap: cannot read the farm's state file" in stuck.stderr, stuck.stderr
    (node.root / "status").write_text("true\n")
    ran = node.run("farm", "./status", PATH=os.environ["PATH"])
    assert ran.returncode == 0, ran.stderr
    assert "1 done" in node.run("farm", "status", "status").stdout  # the list: its ./status.farm


def test_tag_shows_each_tasks_output_live_in_whole_lines_and_keeps_the_logs(
    node: SimNode,
) -> None:
    farm_dir = node.root / "farm"
    tasks = node.root / "tasks.txt"
    tasks.write_text(
        "printf 'zero-'; sleep 0.4; echo end; echo oops >&2\n"
        "sleep 0.2; printf 'one-'; sleep 0.4; printf 'end\\nno newline'\n"
    )
    args = ("farm", "--tag", "--per-gpu", "2", "--gpus", "0", "--dir", str(farm_dir), str(tasks))
    res = node.run(*args, PATH=os.environ["PATH"])
    assert res.returncode == 0, res.stderr
    out = [ln for ln in res.stdout.splitlines() if not ln.startswith(("farm:", "  "))]
    assert sorted(out) == ["0\tzero-end", "1\tno newline", "1\tone-end"], res.stdout
    assert "0\toops" in res.stderr.splitlines(), res.stderr
    assert one((farm_dir / "logs").glob("0000-*.out")).read_text() == "zero-end\n"
    assert one((farm_dir / "logs").glob("0001-*.out")).read_text() == "one-end\nno newline"
    assert one((farm_dir / "logs").glob("0000-*.err")).read_text() == "oops\n"


def _started(rec: Path) -> list[dict[str, Any]]:
    return [r for r in records(rec) if r["event"] == "start"]


def test_tag_never_waits_on_an_output_nobody_reads(node: SimNode) -> None:
    """``farm --tag | less``, paused: the farm's stdout is a pipe nobody reads. The farm must
    still run, reap and end its tasks (the loop that writes the lines also does that); the
    lines it could not show are counted, and the logs have every byte."""
    farm_dir = node.root / "farm"
    tasks = node.root / "tasks.txt"
    tasks.write_text("seq 1 40000\n" * 3)
    args = ("farm", "--tag", "--per-gpu", "3", "--gpus", "0", "--dir", str(farm_dir), str(tasks))
    proc = node.start(*args, PATH=os.environ["PATH"])
    state = farm_dir / "state.jsonl"

    def done() -> int:
        lines = state.read_text().splitlines() if state.exists() else []
        return sum('"status": "done"' in ln for ln in lines)

    try:  # stdout (a pipe) is not read meanwhile
        wait_until(lambda: done() == 3 or proc.poll() is not None, 60, "3 tasks done")
    finally:  # the farm's own summary at the end may wait for its reader, as any program's
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "line(s) of the tasks' output not shown" in err, err
    assert out.startswith(("0\t1\n", "1\t1\n", "2\t1\n")), out[:200]  # shown while it could
    logs = sorted((farm_dir / "logs").glob("*.out"))
    assert len(logs) == 3 and all(p.read_text().count("\n") == 40000 for p in logs)
