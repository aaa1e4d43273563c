"""``mpswrap mpirun ...`` under a real Open MPI ``mpirun``, against the MPS simulator.

Placement (block, cyclic), option rewriting (valued options, ``--``, MPMD ``:``), signals sent
to every process of the run at once, a failing rank, the capacity refusal, attachment
verification, ``mpswrap run`` outside any scheduler, and a report of the supervisor's cost.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.procs import signal_tree
from tests.simenv import SimNode, finish_sim_node, make_sim_node
from tests.waits import sh_wait_for_records

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI mpirun"),
]
MPSWRAP = [sys.executable, "-m", "mpswrap"]
#: Root must say so to Open MPI; CI machines have fewer cores than ranks; every rank runs on
#: this node, so no ssh/rsh is needed (machines without one refuse to start otherwise).
MPIRUN = [
    "mpirun",
    "--oversubscribe",
    "--mca",
    "plm_rsh_agent",
    "false",
    *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="prolog-style daemons need root")


def mpswrap(node: SimNode, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MPSWRAP, *args], env=node.env(), text=True, capture_output=True, timeout=timeout
    )


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def starts(path: Path) -> dict[str, dict[str, Any]]:
    return {str(r["tag"]): r for r in records(path) if r["event"] == "start"}


def end_reasons(path: Path) -> list[str]:
    return sorted(r["reason"] for r in records(path) if r["event"] == "end")


def client(
    node: SimNode, rec: Path, seconds: float, tag: str = "$OMPI_COMM_WORLD_RANK"
) -> list[str]:
    return ["sh", "-c", f'exec {node.client} --seconds {seconds} --record {rec} --tag "{tag}"']


def wait_for_starts(
    rec: Path, count: int, proc: subprocess.Popen[str], timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while len(starts(rec)) < count:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"only {len(starts(rec))} of {count} attached"
        time.sleep(0.1)


def wait_for_program(proc: subprocess.Popen[Any], argv: list[str]) -> psutil.Process:
    """The process running ``argv`` under the supervisor ``proc``, once it runs."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.cmdline() == argv:
                    return child
            except psutil.Error:
                continue
        assert proc.poll() is None, f"exited {proc.returncode} before running {argv}"
        time.sleep(0.02)
    raise AssertionError(f"{argv} not started in 30 s")


class PrologDaemons:
    """Daemons started before the run, as a prolog would: the ranks use them and leave them
    running, so server.log can be read after the run."""

    def __init__(self, node: SimNode, job: str) -> None:
        self.node, self.job = node, job
        res = mpswrap(node, "start", "--job", job)
        assert res.returncode == 0, res.stderr
        self.job_dir = next(node.run_dir.glob(f"*/{job}"))

    def terminations(self) -> int:
        return sum(
            log.read_text().count("Client termination succeeded.")
            for log in self.job_dir.glob("g*/log/server.log")
        )

    def running(self) -> dict[str, int]:
        """Daemon PID per GPU key, of the daemons that are alive."""
        found = {
            p.parent.name: json.loads(p.read_text())["daemon_pid"]
            for p in self.job_dir.glob("g*/manifest.json")
        }
        return {key: pid for key, pid in found.items() if psutil.pid_exists(pid)}

    def stop(self) -> None:
        res = mpswrap(self.node, "stop", "--job", self.job)
        assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("block", ["g0", "g0", "g0", "g1", "g1", "g1"]), ("cyclic", ["g0", "g1"] * 3)],
)
def test_placement_block_and_cyclic(node: SimNode, policy: str, expected: list[str]) -> None:
    rec = node.root / "rec.json"
    res = mpswrap(node, "--policy", policy, *MPIRUN, "-np", "6", *client(node, rec, 1))
    assert res.returncode == 0, res.stderr
    found = starts(rec)
    assert [Path(found[str(r)]["pipe"]).parent.name for r in range(6)] == expected
    servers: dict[str, set[int]] = {Path(r["pipe"]).parent.name: set() for r in found.values()}
    for r in found.values():
        servers[Path(r["pipe"]).parent.name].add(r["server_pid"])
    assert all(len(pids) == 1 for pids in servers.values())  # one server per GPU
    assert servers["g0"] != servers["g1"]
    assert end_reasons(rec) == ["done"] * 6


def test_valued_options_dashdash_and_mpmd_are_wrapped(node: SimNode) -> None:
    rec = node.root / "rec.json"
    res = mpswrap(
        node,
        *MPIRUN,
        "-x",
        "FOO=bar",
        "--mca",
        "btl",
        "self,vader",
        "--bind-to",
        "none",
        "-np",
        "1",
        "--",
        *client(node, rec, 0.5, "a-$FOO"),
        ":",
        "-np",
        "2",
        *client(node, rec, 0.5, "b-$OMPI_COMM_WORLD_RANK"),
    )
    assert res.returncode == 0, res.stderr
    found = starts(rec)
    assert set(found) == {"a-bar", "b-1", "b-2"}
    assert all(r["mode"] == "mps" for r in found.values())


@needs_root
def test_sigterm_to_every_process_ends_each_client_through_mps(node: SimNode) -> None:
    daemons = PrologDaemons(node, "sig")
    try:
        rec = node.root / "rec.json"
        proc = subprocess.Popen(
            [
                *MPSWRAP,
                "--job",
                "sig",
                "--grace",
                "5",
                *MPIRUN,
                "-np",
                "4",
                *client(node, rec, 120),
            ],
            env=node.env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        wait_for_starts(rec, 4, proc)
        assert signal_tree(proc, signal.SIGTERM) >= 9  # mpswrap, mpirun, 4 ranks, 4 clients
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, err
        assert end_reasons(rec) == ["terminated"] * 4, err
        assert daemons.terminations() == 4
    finally:
        daemons.stop()


def test_sigterm_to_every_process_with_user_mode_daemons_leaves_nothing(
    node: SimNode, tmp_path: Path
) -> None:
    """As above, with the ranks' own (user-mode) daemons: the last rank to go stops them, and
    server.log, archived before the directories go, shows every client terminated."""
    rec, archive = node.root / "rec.json", tmp_path / "logs"
    proc = subprocess.Popen(
        [*MPSWRAP, "--grace", "5", *MPIRUN, "-np", "4", *client(node, rec, 120)],
        env=node.env(MPSWRAP_LOG_ARCHIVE=str(archive)),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    wait_for_starts(rec, 4, proc)
    signal_tree(proc, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert end_reasons(rec) == ["terminated"] * 4, err
    logs = "".join(p.read_text() for p in archive.glob("*-server.log"))
    assert logs.count("Client termination succeeded.") == 4, (sorted(archive.iterdir()), err)
    assert not any(node.user_run_dir.glob("*/*")), "user-mode job directory left behind"


@needs_root
def test_failing_rank_sets_the_exit_code_and_others_end_cleanly(node: SimNode) -> None:
    daemons = PrologDaemons(node, "fail")
    try:
        rec = node.root / "rec.json"
        rank = "$OMPI_COMM_WORLD_RANK"
        fail = sh_wait_for_records(rec, "start", 3) + "exit 3"  # once the others are clients
        script = (
            f'if [ "{rank}" = 2 ]; then {fail}; fi; '
            f'exec {node.client} --seconds 120 --record {rec} --tag "{rank}"'
        )
        res = mpswrap(
            node, "--job", "fail", "--grace", "5", *MPIRUN, "-np", "4", "sh", "-c", script
        )
        assert res.returncode == 3, res.stderr
        assert end_reasons(rec) == ["terminated"] * 3, res.stderr
        assert daemons.terminations() == 3
    finally:
        daemons.stop()


@needs_root
def test_sigterm_to_mpswrap_alone_is_passed_on_after_settling(node: SimNode) -> None:
    """``kill <mpswrap pid>``: the launcher never got it, so mpswrap sends it on (after
    grace + terminate_timeout + 5 s, in case the launcher had got it directly)."""
    daemons = PrologDaemons(node, "one")
    try:
        rec = node.root / "rec.json"
        proc = subprocess.Popen(
            [
                *MPSWRAP,
                "--job",
                "one",
                "--grace",
                "1",
                *MPIRUN,
                "-np",
                "2",
                *client(node, rec, 120),
            ],
            env=node.env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        wait_for_starts(rec, 2, proc)
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, err
        assert time.monotonic() - t0 >= 8.5  # settle = 1 + 3 + 5 s
        assert end_reasons(rec) == ["terminated"] * 2, err
        assert daemons.terminations() == 2
    finally:
        daemons.stop()


def test_per_rank_under_mpirun_sums_up_the_node_once(node: SimNode, tmp_path: Path) -> None:
    """``mpirun -np 4 mpswrap ./app``: the ranks of one mpirun share a job (its PMIx
    namespace) and the last to leave prints the node's summary line, once. A rank that never
    became a client and ended before the attach timeout is not warned about: "not seen"."""
    rec, started = node.root / "rec.json", tmp_path / "started"
    started.mkdir()
    rank = "$OMPI_COMM_WORLD_RANK"
    script = (
        f"touch {started}/{rank}; "  # every rank is up before any ends: they overlap
        f'while [ "$(ls {started} | wc -l)" -lt 4 ]; do sleep 0.05; done; '
        f'if [ "{rank}" = 3 ]; then exit 0; fi; '
        f'exec {node.client} --seconds 3 --record {rec} --tag "{rank}"'
    )
    res = subprocess.run(
        [*MPIRUN, "-np", "4", *MPSWRAP, "--", "sh", "-c", script],
        env=node.env(),
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert {r["mode"] for r in starts(rec).values()} == {"mps"} and len(starts(rec)) == 3
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("mpswrap: summary: ")]
    assert len(lines) == 1, res.stderr
    assert re.fullmatch(
        r"mpswrap: summary: node \S+: 4 ranks, 3 attached \(1 not seen\), exit codes 0, "
        r"0 ended by terminate_client, teardown clean, \d+\.\d\d s",
        lines[0],
    ), lines
    assert "not an MPS client" not in res.stderr
    assert not any(node.user_run_dir.glob("*/*")), "user-mode job directory left behind"


def test_49_ranks_on_one_volta_gpu_are_refused_before_launch() -> None:
    one = make_sim_node(gpus=1)
    try:
        rec = one.root / "rec.json"
        res = mpswrap(one, *MPIRUN, "-np", "49", *client(one, rec, 1))
        assert res.returncode == 2  # a request over a limit
        assert "too many MPS clients for one GPU" in res.stderr
        assert "49 new" in res.stderr and "limit 48" in res.stderr
        assert not rec.exists()  # nothing was launched
    finally:
        assert not finish_sim_node(one)


def test_verify_attach_fail_catches_a_wrong_pipe_directory(node: SimNode, tmp_path: Path) -> None:
    rec = node.root / "rec.json"
    script = tmp_path / "app.sh"
    script.write_text(
        "#!/bin/sh\n# a site wrapper that points CUDA elsewhere\n"
        f"CUDA_MPS_PIPE_DIRECTORY={tmp_path}/elsewhere exec {node.client} "
        f"--seconds 60 --record {rec}\n"
    )
    script.chmod(0o755)
    res = mpswrap(
        node,
        "--verify-attach",
        "fail",
        "--verify-timeout",
        "3",
        "--grace",
        "1",
        *MPIRUN,
        "-np",
        "2",
        str(script),
    )
    assert res.returncode == 69, res.stderr
    assert "is not an MPS client" in res.stderr and "/pipe" in res.stderr
    assert "CUDA_MPS_PIPE_DIRECTORY" in res.stderr  # the hint names the likely cause
    assert {r["mode"] for r in records(rec) if r["event"] == "start"} == {"non-mps"}


def test_run_10_outside_any_scheduler_leaves_nothing(node: SimNode) -> None:
    rec = node.root / "rec.json"
    res = mpswrap(node, "run", "-n", "10", "--", *client(node, rec, 0.5, "$MPSWRAP_RANK"))
    assert res.returncode == 0, res.stderr
    assert sorted(starts(rec), key=int) == [str(i) for i in range(10)]
    assert end_reasons(rec) == ["done"] * 10
    assert not any(node.user_run_dir.glob("*/*"))


@needs_root
def test_budget_report_supervisor_start_and_rss(node: SimNode) -> None:
    """Reports (no assert on timing): time from exec of a rank's mpswrap to its program's
    exec, and the supervisor's resident memory, with the job's daemons already running.
    Asserts that every wrapped run ran its program on the job's daemons and left them be."""
    daemons = PrologDaemons(node, "budget")
    pipes = {str(p) for p in daemons.job_dir.glob("g*/pipe")}
    prolog = daemons.running()
    try:
        latencies, rss, bare = [], [], []
        for _ in range(7):
            t0 = time.time()
            out = subprocess.run(
                [sys.executable, "-c", "import time; print(time.time())"],
                capture_output=True,
                text=True,
                check=True,
            )
            bare.append(float(out.stdout) - t0)
            t0 = time.time()
            argv = [*MPSWRAP, "--job", "budget", "--", "date", "+%s.%N"]
            out = subprocess.run(argv, env=node.env(), capture_output=True, text=True, check=True)
            assert t0 < float(out.stdout) < time.time(), out  # the program's own output
            latencies.append(float(out.stdout) - t0)
        for _ in range(3):
            proc = subprocess.Popen(
                [*MPSWRAP, "--job", "budget", "--", "sleep", "1.5"], env=node.env()
            )
            program = wait_for_program(proc, ["sleep", "1.5"])
            rss.append(psutil.Process(proc.pid).memory_info().rss / 2**20)
            assert program.environ().get("CUDA_MPS_PIPE_DIRECTORY") in pipes, program.environ()
            assert proc.wait(30) == 0
        # The runs used the prolog's daemons, left them running, and started none of their own.
        assert daemons.running() == prolog and len(prolog) == 2, (prolog, daemons.running())
        assert not list(node.user_run_dir.glob("*/budget"))
        print(
            f"\nBUDGET supervisor start: median {statistics.median(latencies) * 1000:.0f} ms "
            f"(min {min(latencies) * 1000:.0f}; bare python -c: median "
            f"{statistics.median(bare) * 1000:.0f} ms); RSS per rank: median "
            f"{statistics.median(rss):.1f} MiB; load {os.getloadavg()[0]:.1f} "
            f"on {os.cpu_count()} CPUs"
        )
    finally:
        daemons.stop()
    assert not daemons.job_dir.exists()
