"""The one run lifecycle (``job.run``), as users see it: a dry run refuses what the run
refuses, before any daemon starts; a run starts daemons only for the GPUs it uses; the farm's
summary and the node's summary line count the same runs; an interrupted run says so."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest

from tests.procs import signal_tree
from tests.simenv import MPSWRAP, SimNode
from tests.waits import sh_wait_for_file, wait_until

from .test_launcher import by_tag, client, records, summaries

Way = Callable[[int, list[str]], tuple[list[str], dict[str, str]]]
#: The ways to run, each with its command line (and environment) for N clients of PROGRAM.
MODES: dict[str, Way] = {
    "run": lambda n, program: (["run", "-n", str(n), "--", *program], {}),
    "rank": lambda n, program: (["--", *program], {"MPSWRAP_LOCAL_SIZE": str(n)}),
    "farm": lambda n, program: (["farm", "--per-gpu", str(n), "TASKS"], {}),
}


def _mpswrap(node: SimNode, args: list[str], env: dict[str, str]) -> CompletedProcess[str]:
    argv = [*MPSWRAP, *args]
    return subprocess.run(
        argv, env=node.env(**env), cwd=node.root, text=True, capture_output=True, timeout=60
    )


def _error(stderr: str) -> str:
    """The line that says why mpswrap refused."""
    lines = [line for line in stderr.splitlines() if line.startswith("mpswrap: ")]
    return lines[-1] if lines else stderr


def _open_run_dir(node: SimNode) -> None:
    node.user_run_dir.mkdir()
    node.user_run_dir.chmod(0o755)


CASES = {
    # (what to break before, clients, program, the words of the refusal)
    "user run dir open to others": (_open_run_dir, 1, None, "open to other users"),
    "more clients than a GPU takes": (None, 200, None, "too many MPS clients"),
    "no such program": (None, 1, ["no-such-program-xyz"], "program not found"),
}


@pytest.mark.parametrize(
    ("mode", "case"),
    # A farm's task that cannot start is a failed task (127), not a refusal of the farm.
    [(m, c) for m in sorted(MODES) for c in sorted(CASES) if not (m == "farm" and CASES[c][2])],
)
def test_a_dry_run_refuses_what_the_run_refuses_and_neither_starts_a_daemon(
    node: SimNode, mode: str, case: str
) -> None:
    prepare, clients, program, words = CASES[case]
    rec = node.root / "rec.json"
    program = program or [node.client, "--seconds", "0.1", "--record", str(rec)]
    (node.root / "TASKS").write_text(" ".join(program) + "\n")
    if prepare is not None:
        prepare(node)
    args, env = MODES[mode](clients, program)
    dry_args = ["--dry-run", *args] if mode == "rank" else [args[0], "--dry-run", *args[1:]]
    dry = _mpswrap(node, dry_args, env)
    real = _mpswrap(node, args, env)
    assert real.returncode != 0, real.stderr
    assert words in _error(real.stderr), real.stderr
    assert (dry.returncode, _error(dry.stderr)) == (real.returncode, _error(real.stderr))
    assert "GPU daemon(s)" not in real.stderr, "a daemon started before the refusal"
    assert not records(rec), "a client ran"
    assert not list(node.user_run_dir.glob("*/*")), "a job directory was made"


def test_run_n_1_on_a_two_gpu_node_starts_one_daemon(node: SimNode) -> None:
    """The client lists its job's directory: one GPU entry, not one per GPU of the node."""
    program = ["sh", "-c", 'ls "${CUDA_MPS_PIPE_DIRECTORY%/g*/pipe}"']
    res = node.run("run", "-n", "1", "--", *program)
    assert res.returncode == 0, res.stderr
    assert re.findall(r"^\[0\] (g\d+)$", res.stdout, re.M) == ["g0"], res.stdout
    assert "1 GPU daemon(s)" in res.stderr, res.stderr


def test_run_n_3_on_a_two_gpu_node_starts_both(node: SimNode) -> None:
    program = ["sh", "-c", 'ls "${CUDA_MPS_PIPE_DIRECTORY%/g*/pipe}"']
    res = node.run("run", "-n", "3", "--", *program)
    assert res.returncode == 0, res.stderr
    assert set(re.findall(r"^\[0\] (g\d+)$", res.stdout, re.M)) == {"g0", "g1"}, res.stdout


def test_the_farm_and_the_node_line_count_the_same_runs(node: SimNode) -> None:
    """Done, failed and a program that does not exist (127): every started task counts."""
    tasks = node.root / "tasks.txt"
    tasks.write_text("true\ntrue\ntrue\nfalse\nsh -c 'exit 3'\nno-such-program-xyz\n")
    res = node.run("farm", "--per-gpu", "2", str(tasks))
    assert res.returncode == 1, res.stderr
    head = re.search(
        r"^farm: (\d+) tasks: (\d+) done, (\d+) failed, (\d+) not run", res.stdout, re.M
    )
    assert head is not None, res.stdout
    assert head.groups() == ("6", "3", "3", "0"), res.stdout
    (line,) = summaries(res.stderr)
    ranks, codes = int(line[1]), line[3]
    assert ranks == 6, res.stderr
    assert codes == "0 (3), 1 (1), 3 (1), 127 (1)", res.stderr


def test_status_shows_the_run_record_the_farm_and_node_line_count(node: SimNode) -> None:
    """While a farm runs, ``status`` counts the tasks that ended from the same run record
    the node's summary line is made of; at the end, all three agree."""
    release = node.root / "release"
    tasks = node.root / "tasks.txt"
    waiting = shlex.quote(sh_wait_for_file(release) + "true")
    tasks.write_text(f"true\nfalse\nno-such-program-xyz\nsh -c {waiting}\n")
    proc = node.start("farm", "--job", "fx", "--per-gpu", "2", str(tasks))
    try:

        def status() -> str:
            return node.run("status", "--job", "fx").stdout

        wait_until(lambda: "programs ended so far: 3," in status(), 60, "3 tasks to end")
        assert "programs ended so far: 3, exit codes 0 (1), 1 (1), 127 (1)" in status()
    finally:
        release.write_text("")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert re.search(r"^farm: 4 tasks: 2 done, 2 failed, 0 not run", out, re.M), out
    (line,) = summaries(err)
    assert (line[1], line[3]) == ("4", "0 (2), 1 (1), 127 (1)"), err


def test_an_interrupted_run_says_so_once(node: SimNode) -> None:
    rec = node.root / "rec.json"
    proc = node.start("run", "-n", "2", "--grace", "5", "--", *client(node, rec, 60))
    wait_until(lambda: len(by_tag(records(rec), "start")) == 2, 30, "2 clients to start")
    signal_tree(proc, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, err
    said = re.findall(r"^mpswrap: run \S+: interrupted by SIGINT .*exit code 130$", err, re.M)
    assert len(said) == 1, err
    assert sorted(r["reason"] for r in by_tag(records(rec), "end").values()) == ["terminated"] * 2


def test_a_farm_interrupted_says_so_once(node: SimNode) -> None:
    rec = node.root / "rec.json"
    tasks = node.root / "tasks.txt"
    tasks.write_text(f"{node.client} --seconds 60 --record {rec}\n" * 2)
    proc = node.start("farm", "--per-gpu", "1", str(tasks))
    wait_until(lambda: len(_starts(rec)) == 2, 30, "2 tasks to start")
    signal_tree(proc, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert len(re.findall(r"interrupted by SIGTERM", err)) == 1, err


def _starts(rec: Path) -> list[dict[str, Any]]:
    return [r for r in records(rec) if r["event"] == "start"]
