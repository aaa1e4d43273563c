"""The launcher as users run it (``python -m mpswrap ...``) against the MPS simulator.

Every test runs real processes in a private directory and fails if any daemon, server or
client of that directory survives it (``finish_sim_node``); the watchdog's own test reaps its
stand-in processes itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from mpswrap import _proc
from mpswrap.mps.gpu import load_inventory
from tests.placed import placed
from tests.procs import described, signal_tree
from tests.simenv import MPSWRAP, SimNode, sim_node
from tests.users import ensure_test_user
from tests.waits import sh_wait_for_records, wait_until

pytestmark = pytest.mark.functional


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def client(node: SimNode, rec: Path, seconds: float, tag: str = "$MPSWRAP_RANK") -> list[str]:
    """A simulated client that tags its records with the rank (through a shell)."""
    return ["sh", "-c", f'exec {node.client} --seconds {seconds} --record {rec} --tag "{tag}"']


def by_tag(recs: list[dict[str, Any]], event: str) -> dict[str, dict[str, Any]]:
    """Records of one event by the client's tag (end records name only the pid)."""
    tags = {r["pid"]: str(r.get("tag")) for r in recs if r["event"] == "start"}
    return {tags.get(r["pid"], "?"): r for r in recs if r["event"] == event}


# --- mpswrap run -n N ----------------------------------------------------------------------
def test_run_places_ranks_by_block_and_leaves_nothing(node: SimNode) -> None:
    rec = node.root / "rec.json"
    res = node.run("run", "-n", "4", "--", *client(node, rec, 0.3))
    assert res.returncode == 0, res.stderr
    starts = by_tag(records(rec), "start")
    keys = {tag: Path(r["pipe"]).parent.name for tag, r in starts.items()}
    assert keys == {"0": "g0", "1": "g0", "2": "g1", "3": "g1"}
    assert all(r["mode"] == "mps" for r in starts.values())
    assert len({starts["0"]["cvd"], starts["2"]["cvd"]}) == 2  # each on its own GPU's UUID
    assert [r["reason"] for r in records(rec) if r["event"] == "end"] == ["done"] * 4
    for index in range(4):
        assert re.search(rf"^\[{index}\] mps-sim-client \d+ mode=mps", res.stdout, re.M)
    assert not any(node.user_run_dir.glob("*/*")), "the run's layout must be removed"


def test_run_cyclic_alternates_gpus(node: SimNode) -> None:
    rec = node.root / "rec.json"
    res = node.run("run", "-n", "3", "--policy", "cyclic", "--", *client(node, rec, 0.2))
    assert res.returncode == 0, res.stderr
    keys = {t: Path(r["pipe"]).parent.name for t, r in by_tag(records(rec), "start").items()}
    assert keys == {"0": "g0", "1": "g1", "2": "g0"}


def _rank_1_fails_once_the_others_are_clients(node: SimNode, rec: Path) -> list[str]:
    """``sh -c`` of 3 ranks: 0 and 2 are clients for a minute, 1 exits 3 once they started."""
    fail = sh_wait_for_records(rec, "start", 2) + "exit 3"
    client = f'exec {node.client} --seconds 60 --record {rec} --tag "$MPSWRAP_RANK"'
    return ["sh", "-c", f'if [ "$MPSWRAP_RANK" = 1 ]; then {fail}; fi; {client}']


def test_run_first_failing_rank_ends_the_others_through_terminate_client(node: SimNode) -> None:
    rec = node.root / "rec.json"
    script = _rank_1_fails_once_the_others_are_clients(node, rec)
    res = node.run("run", "-n", "3", "--grace", "5", "--", *script)
    assert res.returncode == 3, res.stderr
    ends = by_tag(records(rec), "end")
    assert {t: r["reason"] for t, r in ends.items()} == {"0": "terminated", "2": "terminated"}
    assert "rank 1 exited with code 3" in res.stderr


def test_run_sigterm_to_every_process_ends_clients_cleanly(node: SimNode) -> None:
    rec = node.root / "rec.json"
    proc = node.start("run", "-n", "3", "--grace", "5", "--", *client(node, rec, 60))
    wait_until(lambda: len(by_tag(records(rec), "start")) == 3, 30, "3 clients to start")
    assert signal_tree(proc, signal.SIGTERM) >= 4
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    ends = by_tag(records(rec), "end")
    assert sorted(r["reason"] for r in ends.values()) == ["terminated"] * 3
    assert "CUDA error 810" in out + err


def test_run_sigkilled_still_ends_every_client_through_mps(node: SimNode) -> None:
    """SIGKILL takes the supervisor (no ladder of its own): its guard ends the shielded
    ranks through terminate_client."""
    rec = node.root / "rec.json"
    proc = node.start("run", "-n", "2", "--grace", "5", "--", *client(node, rec, 60))
    wait_until(lambda: len(by_tag(records(rec), "start")) == 2, 30, "2 clients to start")
    proc.kill()  # the supervisor alone
    proc.communicate(timeout=30)
    wait_until(lambda: len(by_tag(records(rec), "end")) == 2, 30, "2 clients to end")
    ends = by_tag(records(rec), "end")
    assert sorted(r["reason"] for r in ends.values()) == ["terminated"] * 2, ends
    _all_ended(node, "the guard to stop the daemons and exit")


def test_run_prefixes_output_and_keeps_a_last_line_without_newline(node: SimNode) -> None:
    res = node.run(
        "run",
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        'printf "out $MPSWRAP_RANK\\nlast"; printf "err\\xff\\n" >&2',
    )
    assert res.returncode == 0, res.stderr
    for rank in ("0", "1"):
        assert f"[{rank}] out {rank}\n" in res.stdout
        assert f"[{rank}] last\n" in res.stdout
        assert f"[{rank}] err" in res.stderr  # bytes that are not UTF-8 pass through


def test_run_refuses_more_clients_than_one_gpu_takes(one_gpu: SimNode) -> None:
    res = one_gpu.run("run", "-n", "49", "--", "true")
    assert res.returncode == 2  # a request over a limit
    assert "too many MPS clients for one GPU" in res.stderr
    assert "limit 48" in res.stderr


def test_run_dry_run_prints_ranks_and_starts_nothing(node: SimNode) -> None:
    res = node.run(
        "run",
        "-n",
        "4",
        "--dry-run",
        "--threads",
        "uniform",
        "--mem-limit",
        "auto",
        "--priority",
        "1",
        "--",
        "echo",  # it must exist: a dry run refuses what the run refuses
        "x y",
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 4
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in lines[0]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M" in lines[0]  # 80 GiB / 2 ranks
    assert "CUDA_MPS_CLIENT_PRIORITY=1" in lines[3]
    assert "/g1/pipe" in lines[3] and "MPSWRAP_LOCAL_SIZE=4" in lines[3]
    assert lines[0].endswith("echo 'x y'")
    assert not node.user_run_dir.exists() or not any(node.user_run_dir.iterdir())


@pytest.mark.parametrize("policy", ["block", "cyclic", "affinity"])
def test_run_dry_run_puts_eight_ranks_on_four_gpus_where_the_policy_says(policy: str) -> None:
    """What the GPU tier's multi-GPU phase checks against real runs (tests/placed.py),
    checked here against the dry run on four simulated GPUs, which alternate between two
    halves of the CPUs: affinity with the run pinned to the CPUs near GPU 1."""
    with sim_node(gpus=4) as node:
        inventory = load_inventory(str(node.inventory)).gpus
        gpus, near = [g.uuid for g in inventory], [g.cpus for g in inventory]
        cpus = near[1] if policy == "affinity" else frozenset(os.sched_getaffinity(0))
        pin = ["taskset", "-c", ",".join(map(str, sorted(cpus)))]
        argv = [*pin, *MPSWRAP, "run", "-n", "8", "--policy", policy, "--dry-run", "--", "true"]
        res = subprocess.run(
            argv, env=node.env(), cwd=node.root, text=True, capture_output=True, timeout=60
        )
    assert res.returncode == 0, res.stderr
    shown = re.findall(r"^\[(\d+)\] gpu \d+ \((\S+)\): ", res.stdout, re.M)
    assert [int(rank) for rank, _ in shown] == list(range(8)), res.stdout
    want = placed(policy, 8, gpus, gpu_cpus=near, rank_cpus=cpus)
    assert [uuid for _, uuid in shown] == want
    if policy == "affinity" and near[0] != near[1]:  # two halves: only GPUs 1 and 3 are near
        assert set(want) == {gpus[1], gpus[3]}, want


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "bogus", "./a"], "argument --policy: invalid value 'bogus'"),
        (["run", "--", "true"], "-n"),
        # A program that exists: a missing one is refused first (127).
        (["--threads", "lots", "true"], "argument --threads: invalid value 'lots'"),
        (["--mem-limit", "3T", "true"], "argument --mem-limit: invalid value"),
        (["--mem-limit", "99999999999999999999G", "true"], "argument --mem-limit: invalid value"),
        (["srun", "--multi-prog", "tasks.conf"], "multi-prog"),
    ],
)
def test_usage_errors_exit_2(node: SimNode, args: list[str], message: str) -> None:
    res = node.run(*args)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr
    assert res.stderr.startswith("mpswrap: ")


def test_run_as_a_regular_user(node: SimNode) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs as the current user already elsewhere")
    user = ensure_test_user()
    rec = node.root / "rec.json"
    res = node.mpswrap("run", "-n", "2", "--", *client(node, rec, 0.2), user=user)
    assert res.returncode == 0, res.stderr
    assert {r["uid"] for r in records(rec) if r["event"] == "start"} == {pwd.getpwnam(user).pw_uid}


# --- per-rank mode ---------------------------------------------------------------------
def test_rank_mode_uses_the_innermost_launcher_rank(node: SimNode) -> None:
    rec = node.root / "rec.json"
    res = node.run(
        "--job",
        "t1",
        "--",
        *client(node, rec, 0.2, tag="x"),
        SLURM_LOCALID="0",
        OMPI_COMM_WORLD_LOCAL_RANK="1",
        OMPI_COMM_WORLD_LOCAL_SIZE="2",
    )
    assert res.returncode == 0, res.stderr
    (start_rec,) = [r for r in records(rec) if r["event"] == "start"]
    assert Path(start_rec["pipe"]).parent.name == "g1"
    assert start_rec["mode"] == "mps"


def test_rank_mode_passes_exit_codes_through(node: SimNode) -> None:
    assert node.run("--job", "t2", "--", "sh", "-c", "exit 5").returncode == 5
    missing = node.run("--job", "t2", "--", "no-such-program-xyz")
    assert missing.returncode == 127
    assert "program not found" in missing.stderr


def test_rank_mode_sigterm_at_once_ends_client_through_mps(node: SimNode) -> None:
    rec = node.root / "rec.json"
    proc = node.start("--job", "t3", "--grace", "5", "--", *client(node, rec, 60, tag="r"))
    wait_until(lambda: by_tag(records(rec), "start"), 30, "the client to start")
    signal_tree(proc, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert by_tag(records(rec), "end")["r"]["reason"] == "terminated"
    _all_ended(node, "the daemons to be stopped and their stopper to exit")


def test_rank_mode_supervisor_sigkilled_still_ends_client_through_mps(node: SimNode) -> None:
    rec = node.root / "rec.json"
    proc = node.start("--job", "t3k", "--grace", "5", "--", *client(node, rec, 60, tag="r"))
    wait_until(lambda: by_tag(records(rec), "start"), 30, "the client to start")
    proc.kill()  # the supervisor alone: its child ignores SIGTERM and outlives it
    proc.communicate(timeout=30)
    wait_until(lambda: "r" in by_tag(records(rec), "end"), 30, "the client to end")
    assert by_tag(records(rec), "end")["r"]["reason"] == "terminated"
    _all_ended(node, "the daemons to be stopped and their stopper to exit")


def test_user_daemons_are_ended_when_their_job_dir_vanishes(node: SimNode) -> None:
    """A tmp cleaner or a logout removes the user-mode job directory under running daemons
    (which, like the real ones, outlive their pipe directory): once its owners are gone, the
    watchdog ends them by the identities it saw."""
    rec = node.root / "rec.json"
    proc = node.start("--job", "gone", "--grace", "1", "--", *client(node, rec, 60, tag="r"))
    wait_until(lambda: by_tag(records(rec), "start"), 30, "the client to start")
    job_dir = next(node.user_run_dir.glob("*/gone"))
    daemons = [
        psutil.Process(json.loads(m.read_text())["daemon_pid"])
        for m in job_dir.glob("g*/manifest.json")
    ]
    assert daemons and all(d.is_running() for d in daemons)
    shutil.rmtree(job_dir)
    signal_tree(proc, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    _, alive = psutil.wait_procs(daemons, timeout=15)
    assert not alive, f"daemons outlived their job directory: {alive}"
    # The rank's teardown neither made the directory again nor claimed a teardown it left to
    # the watchdog.
    assert not job_dir.exists()
    assert "teardown not run (job directory gone)" in err, err
    _all_ended(node, "the watchdog to exit")


def _all_ended(node: SimNode, what: str) -> None:
    """Nothing of the node runs within 30 s: what ends the daemons after the supervisor went
    (its guard, the watchdog) ends too, on a machine as busy as it may be."""
    left = [d for p in node.wait_nothing_left(30) if (d := described(p)) is not None]
    assert not left, f"{what}: still running after 30 s: {left}"


def _in_sleep(pid: int) -> int | None:
    """Which of its sleeps the process is in, numbered by its voluntary context switches so
    far (each sleep adds one), or None while it is not asleep."""
    proc = psutil.Process(pid)
    before = proc.num_ctx_switches().voluntary
    asleep = proc.status() == psutil.STATUS_SLEEPING
    return before if asleep and proc.num_ctx_switches().voluntary == before else None


def _looked_again(watchdog: subprocess.Popen[bytes]) -> Callable[[], bool]:
    """Whether the watchdog has looked at its processes again since this call (or exited).

    It sleeps between two looks: seen asleep, then seen in a later sleep, it woke from the
    first after this call and looked, whole, before the second."""
    first: list[int] = []

    def looked() -> bool:
        if watchdog.poll() is not None:
            return True
        sleep = _in_sleep(watchdog.pid)
        if sleep is not None and not first:
            first.append(sleep)
        return sleep is not None and sleep > first[0]

    return looked


def test_a_watchdog_that_starts_after_its_directory_went_still_ends_the_daemons(
    tmp_path: Path,
) -> None:
    """The cleaner may win the race with the watchdog's start: what its starter saw is enough.
    It waits for the owners it was told of, and for the clients of any that joined later (no
    reference of theirs is left to read): only then does it kill the daemon."""
    job_dir = tmp_path / "run" / "node" / "late"
    job_dir.mkdir(parents=True)
    st = job_dir.stat()
    joined = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=f"{job_dir}/g0/pipe")
    with contextlib.ExitStack() as stack:
        daemon, owner, client = (
            stack.enter_context(subprocess.Popen(["sleep", "60"], env=env))
            for env in (os.environ, os.environ, joined)
        )
        for proc in (daemon, owner, client):
            stack.callback(proc.kill)
        seen = {
            "dir": [st.st_dev, st.st_ino],
            "daemons": [_proc.identify(daemon.pid).to_json()],  # type: ignore[union-attr]
            "owners": [_proc.identify(owner.pid).to_json()],  # type: ignore[union-attr]
        }
        shutil.rmtree(job_dir)
        argv = [sys.executable, "-m", "mpswrap.job.watchdog", str(job_dir), json.dumps(seen)]
        watchdog = stack.enter_context(subprocess.Popen(argv))
        stack.callback(watchdog.kill)
        for gone in (owner, client):
            wait_until(_looked_again(watchdog), 30, f"the watchdog to look while {gone.pid} runs")
            assert daemon.poll() is None and watchdog.poll() is None, f"killed before {gone.pid}"
            gone.kill()
        assert watchdog.wait(timeout=30) == 0
        assert daemon.wait(timeout=10) == -signal.SIGKILL


def test_rank_mode_forwards_usr1_untouched(node: SimNode, tmp_path: Path) -> None:
    marker = tmp_path / "usr1"
    program = (  # ends once it got SIGUSR1 (or after 20 s without)
        "import signal\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])\n"
        f"open({str(tmp_path / 'ready')!r}, 'w').close()\n"
        "if signal.sigtimedwait([signal.SIGUSR1], 20):\n"
        f"    open({str(marker)!r}, 'w').close()\n"
    )
    proc = node.start("--job", "t4", "--", sys.executable, "-c", program)
    wait_until((tmp_path / "ready").exists, 30, "the child to be ready")
    os.kill(proc.pid, signal.SIGUSR1)  # the supervisor only: it must pass it on
    proc.communicate(timeout=60)
    assert marker.exists(), "the child never got SIGUSR1"
    assert proc.returncode == 0  # USR1 is not a reason to fail


def _redirected(node: SimNode, rec: Path, tmp_path: Path) -> list[str]:
    """A wrapper script that points the client at a pipe directory with no daemon."""
    script = tmp_path / "wrong-pipe.sh"
    script.write_text(
        f"#!/bin/sh\nCUDA_MPS_PIPE_DIRECTORY={tmp_path}/nowhere exec "
        f"{node.client} --seconds 30 --record {rec}\n"
    )
    script.chmod(0o755)
    return [str(script)]


def test_verify_attach_fail_catches_a_client_without_mps(node: SimNode, tmp_path: Path) -> None:
    rec = node.root / "rec.json"
    res = node.run(
        "--job",
        "t5",
        "--verify-attach",
        "fail",
        "--verify-timeout",
        "2",
        "--grace",
        "1",
        "--",
        *_redirected(node, rec, tmp_path),
    )
    assert res.returncode == 69, res.stderr
    assert "is not an MPS client" in res.stderr and "/g0/pipe" in res.stderr
    assert "hint: " in res.stderr
    assert records(rec)[0]["mode"] == "non-mps"


def test_verify_attach_passes_for_a_real_client(node: SimNode) -> None:
    rec = node.root / "rec.json"
    res = node.run(
        "--job",
        "t6",
        "--verify-attach",
        "fail",
        "--verify-timeout",
        "10",
        "--",
        *client(node, rec, 1.5, tag="v"),
    )
    assert res.returncode == 0, res.stderr
    assert "not an MPS client" not in res.stderr


def test_verify_attach_warn_continues(node: SimNode, tmp_path: Path) -> None:
    rec = node.root / "rec.json"
    script = tmp_path / "short.sh"
    script.write_text(
        f"#!/bin/sh\nCUDA_MPS_PIPE_DIRECTORY={tmp_path}/nowhere exec "
        f"{node.client} --seconds 2 --record {rec}\n"
    )
    script.chmod(0o755)
    res = node.run(
        "--job", "t7", "--verify-attach", "warn", "--verify-timeout", "0.5", "--", str(script)
    )
    assert res.returncode == 0, res.stderr
    assert "is not an MPS client" in res.stderr


# --- prefix mode (without running a launcher) ----------------------------------------------
def test_prefix_dry_run_shows_the_rewritten_command(node: SimNode) -> None:
    app = node.root / "app"
    app.write_text("#!/bin/sh\n")
    app.chmod(0o755)
    res = node.run(
        "--dry-run",
        "--policy",
        "cyclic",
        "mpirun",
        "-np",
        "2",
        "--mca",
        "a",
        "b",
        "./app",
        "-np",
        "9",
    )
    assert res.returncode == 0, res.stderr
    cmd = res.stdout.splitlines()[-1]
    assert re.search(r"-m mpswrap --job=mpirun-\d+ --policy=cyclic -- \./app -np 9$", cmd)
    assert "-x MPSWRAP_GPU_INVENTORY" in cmd and cmd.startswith("mpirun -x ")
    assert "OMPI_MCA_odls_base_sigkill_timeout=5" in res.stdout
    assert "-x MPSWRAP_JOB" in cmd and re.search(r"^MPSWRAP_JOB=mpirun-\d+$", res.stdout, re.M)


def test_prefix_refuses_49_ranks_on_one_gpu_before_launch(one_gpu: SimNode) -> None:
    res = one_gpu.run("mpirun", "-np", "49", "./never-started")
    assert res.returncode == 2  # a request over a limit
    assert "too many MPS clients for one GPU" in res.stderr and "hint:" in res.stderr


def test_run_verify_attach_fail_ends_every_rank(node: SimNode, tmp_path: Path) -> None:
    rec = node.root / "rec.json"
    script = (
        f'if [ "$MPSWRAP_RANK" = 1 ]; then export CUDA_MPS_PIPE_DIRECTORY={tmp_path}; fi; '
        f'exec {node.client} --seconds 60 --record {rec} --tag "$MPSWRAP_RANK"'
    )
    res = node.run(
        "run",
        "-n",
        "3",
        "--verify-attach",
        "fail",
        "--verify-timeout",
        "3",
        "--grace",
        "2",
        "--",
        "sh",
        "-c",
        script,
    )
    assert res.returncode == 69, res.stderr
    assert "rank 1 is not an MPS client" in res.stderr
    assert {t: r["mode"] for t, r in by_tag(records(rec), "start").items()} == {
        "0": "mps",
        "1": "non-mps",
        "2": "mps",
    }
    assert by_tag(records(rec), "end")["0"]["reason"] == "terminated"


# --- saying what happened: a rank without MPS, and the summary line -------------------------
SUMMARY = re.compile(
    r"^mpswrap: summary: node (\S+): (\d+) (?:ranks?|tasks?), (.+?), exit codes (.+?), "
    r"(\d+) ended by terminate_client, teardown (.+?), (\d+\.\d\d) s$",
    re.M,
)


def summaries(stderr: str) -> list[tuple[str, ...]]:
    return [m.groups() for m in SUMMARY.finditer(stderr)]


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ((), {}, (0, True, "0 attached (2 not seen)")),  # the default: warn
        (("--verify-attach", "fail"), {}, (69, True, "0 attached (2 not seen)")),
        (("--verify-attach", "off"), {}, (0, False, "attach not checked")),
        ((), {"MPSWRAP_VERIFY_ATTACH": "off"}, (0, False, "attach not checked")),  # the setting
    ],
)
def test_run_says_when_ranks_run_without_mps(
    node: SimNode, args: tuple[str, ...], env: dict[str, str], expected: tuple[int, bool, str]
) -> None:
    """The program's own environment points CUDA at a pipe directory with no daemon: CUDA
    (and the simulated client) then runs without MPS, silently. mpswrap must say so."""
    code, warned, attached = expected
    rec = node.root / "rec.json"
    program = [
        "env",
        "CUDA_MPS_PIPE_DIRECTORY=/nonexistent",
        node.client,
        "--seconds",
        "4",
        "--record",
        str(rec),
    ]
    res = node.run(
        "run",
        "-n",
        "2",
        "--verify-timeout",
        "1",
        "--grace",
        "1",
        *args,
        "--",
        *program,
        **env,  # type: ignore[arg-type]
    )
    assert res.returncode == code, res.stderr
    assert {r["mode"] for r in records(rec) if r["event"] == "start"} == {"non-mps"}
    not_client = re.findall(
        r"^mpswrap: rank (\d) is not an MPS client \(pid \d+, pipe "
        r"(\S+)\): ",
        res.stderr,
        re.M,
    )
    named = sorted((rank, Path(pipe).parent.name) for rank, pipe in not_client)
    if code == 69:  # the first found ends the run
        assert len(named) == 1 and named[0] in [("0", "g0"), ("1", "g1")], res.stderr
    elif warned:  # once per rank, naming its GPU's pipe directory
        assert named == [("0", "g0"), ("1", "g1")], res.stderr
    else:
        assert not named and "not an MPS client" not in res.stderr, res.stderr
    assert ("CUDA_MPS_PIPE_DIRECTORY" in res.stderr) == warned  # what to check
    assert all(pipe.startswith(f"{node.user_run_dir}/") for _, pipe in not_client)
    ((_, ranks, seen, *_),) = summaries(res.stderr)
    assert (ranks, seen) == ("2", attached), res.stderr


def test_run_summary_counts_exit_codes_and_terminated_clients(node: SimNode) -> None:
    rec = node.root / "rec.json"
    script = _rank_1_fails_once_the_others_are_clients(node, rec)
    started = time.monotonic()
    res = node.run("run", "-n", "3", "--grace", "5", "--", *script)
    took = time.monotonic() - started
    assert res.returncode == 3, res.stderr
    assert sorted(r["reason"] for r in by_tag(records(rec), "end").values()) == ["terminated"] * 2
    assert "is not an MPS client" not in res.stderr  # rank 1 ended before the timeout
    ((host, ranks, seen, codes, ended, teardown, seconds),) = summaries(res.stderr)
    assert host == os.uname().nodename
    assert (ranks, seen, codes, ended, teardown) == (
        "3",
        "2 attached (1 not seen)",
        "1 (2), 3 (1)",
        "2",
        "clean",
    ), res.stderr
    assert 0 < float(seconds) <= took  # the run's own time
    assert res.stderr.rstrip().endswith(" s"), "the summary is the run's last word"


def _barrier(folder: Path, n: int) -> str:
    """Shell: mark this rank started, then wait until ``n`` ranks have (so they overlap)."""
    return (
        f"touch {folder}/$MPSWRAP_LOCAL_RANK; "
        f'while [ "$(ls {folder} | wc -l)" -lt {n} ]; do sleep 0.05; done; '
    )


def _per_rank_node(node: SimNode, folder: Path, job: str, n: int) -> list[str]:
    """``n`` per-rank supervisors of one job on one node, as a launcher starts them; rank 1
    is no CUDA program and exits 4; the others are clients for 1 s. Their stderr, by rank."""
    rec = folder / "rec.json"
    folder.mkdir()
    folder = folder / "started"
    folder.mkdir()
    client_then = f"exec {node.client} --seconds 1 --record {rec}"
    procs = [
        node.start(
            "--job",
            job,
            "--",
            "sh",
            "-c",
            _barrier(folder, n) + ("exit 4" if i == 1 else client_then),
            MPSWRAP_LOCAL_RANK=str(i),
            MPSWRAP_LOCAL_SIZE=str(n),
        )
        for i in range(n)
    ]
    errs = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [4 if i == 1 else 0 for i in range(n)], errs
    assert len([r for r in records(rec) if r.get("mode") == "mps"]) == n - 1
    return errs


def test_per_rank_mode_prints_one_summary_for_the_node(node: SimNode, tmp_path: Path) -> None:
    errs = _per_rank_node(node, tmp_path / "ranks", "sum1", 3)
    found = [s for err in errs for s in summaries(err)]
    assert len(found) == 1, errs
    (_, ranks, seen, codes, ended, teardown, _) = found[0]
    assert (ranks, seen, codes, ended, teardown) == (
        "3",
        "2 attached (1 not seen)",
        "0 (2), 4 (1)",
        "0",
        "clean",
    ), errs
    assert not any(node.user_run_dir.glob("*/*")), "the job's records must go with it"


@pytest.mark.skipif(os.geteuid() != 0, reason="prolog-style daemons need root")
def test_per_rank_mode_on_prolog_daemons_sums_up_and_leaves_them_be(
    node: SimNode, tmp_path: Path
) -> None:
    assert node.run("start", "--job", "sum2").returncode == 0
    job_dir = next(node.run_dir.glob("*/sum2"))
    try:
        for step in ("a", "b"):  # two steps of one job: a summary each, nothing carried over
            errs = _per_rank_node(node, tmp_path / step, "sum2", 2)
            found = [s for err in errs for s in summaries(err)]
            assert len(found) == 1, errs
            assert found[0][1:6] == (
                "2",
                "1 attached (1 not seen)",
                "0 (1), 4 (1)",
                "0",
                "by the epilog",
            ), errs
            assert not (job_dir / "outcomes").exists()
            assert sorted(p.name for p in job_dir.glob("g*")) == ["g0", "g1"]
    finally:
        assert node.run("stop", "--job", "sum2").returncode == 0
    assert not job_dir.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="prolog-style daemons need root")
def test_a_rank_joining_prolog_daemons_takes_its_gpu_from_the_manifest(
    node: SimNode, tmp_path: Path
) -> None:
    """No NVML per rank: with the prolog's daemons up, a rank places itself from the manifests,
    so even with the node's inventory gone each rank gets its GPU and that GPU's daemon."""
    assert node.run("start", "--job", "inv1").returncode == 0
    gpus = json.loads(node.inventory.read_text())["gpus"]
    hidden = tmp_path / "gpus.json"
    node.inventory.rename(hidden)
    try:
        for rank in (0, 1):
            out = node.run(
                "--job",
                "inv1",
                "--",
                "sh",
                "-c",
                "echo $CUDA_MPS_PIPE_DIRECTORY $CUDA_VISIBLE_DEVICES",
                MPSWRAP_LOCAL_RANK=str(rank),
                MPSWRAP_LOCAL_SIZE="2",
            )
            assert out.returncode == 0, out.stderr
            assert out.stdout.split() == [
                str(next(node.run_dir.glob("*/inv1")) / f"g{rank}" / "pipe"),
                gpus[rank]["uuid"],
            ], out.stdout
    finally:
        hidden.rename(node.inventory)
        assert node.run("stop", "--job", "inv1").returncode == 0


# --- a rank of several GPUs ----------------------------------------------------------------
@pytest.fixture
def four_gpus() -> Any:
    from tests.simenv import sim_node

    with sim_node(gpus=4) as sim:
        yield sim


def test_ranks_of_two_gpus_get_one_daemon_over_each_pair(four_gpus: SimNode) -> None:
    """``run -n 4 --gpus-per-rank 2`` on four GPUs: one daemon over GPUs 0-1 and one over
    2-3, each rank sees its pair (``CUDA_VISIBLE_DEVICES`` naming both UUIDs) and is a client
    of its pair's daemon; block placement puts ranks 0-1 on the first pair."""
    node = four_gpus
    rec = node.root / "rec.json"
    uuids = [g["uuid"] for g in sorted(_inventory(node), key=lambda g: int(g["index"]))]
    res = node.run("run", "-n", "4", "--gpus-per-rank", "2", "--", *client(node, rec, 3))
    assert res.returncode == 0, res.stderr
    assert "2 GPU daemon(s)" in res.stderr and "4 attached" in res.stderr, res.stderr
    starts = by_tag(records(rec), "start")
    assert all(r["mode"] == "mps" for r in starts.values()), starts
    pairs = [",".join(uuids[0:2]), ",".join(uuids[2:4])]
    assert {t: (Path(r["pipe"]).parent.name, r["cvd"]) for t, r in starts.items()} == {
        "0": ("g0", pairs[0]),
        "1": ("g0", pairs[0]),
        "2": ("g1", pairs[1]),
        "3": ("g1", pairs[1]),
    }


def _inventory(node: SimNode) -> list[dict[str, Any]]:
    gpus: list[dict[str, Any]] = json.loads(node.inventory.read_text())["gpus"]
    return gpus


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["run", "-n", "2", "--gpus-per-rank", "3", "--", "true"], "the run has 2 GPU(s)"),
        (["--gpus-per-rank", "0", "run", "-n", "1", "--", "true"], "expected a whole number"),
        (["farm", "--gpus-per-rank", "2", "tasks.txt"], "unknown option '--gpus-per-rank'"),
    ],
    ids=["not-dividing", "zero", "farm"],
)
def test_a_gpus_per_rank_that_cannot_be_served_is_one_line(
    node: SimNode, args: list[str], line: str
) -> None:
    (node.root / "tasks.txt").write_text("true\n")
    res = node.run(*args)
    assert res.returncode == 2, res.stderr
    assert line in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not node.leftovers()


# --- torchrun -----------------------------------------------------------------------------
#: A stand-in for PyTorch's torchrun: ``--nproc-per-node N`` workers with torchrun's rank
#: variables, its script run by this interpreter (``-m`` a module) unless ``--no-python``;
#: TERM and INT passed to every worker; exit code the first failing worker's. Any other
#: option is refused, so a rewrite that torchrun would not take fails here too.
FAKE_TORCHRUN = """#!{python}
import os, signal, subprocess, sys
args, n, no_python, module = sys.argv[1:], 1, False, False
while args and args[0].startswith("-"):
    name, eq, value = args.pop(0).lstrip("-").partition("=")
    name = name.replace("_", "-")
    if name == "nproc-per-node":
        n = int(value if eq else args.pop(0))
    elif name == "no-python":
        no_python = True
    elif name in ("m", "module"):
        module = True
    elif name != "standalone":
        sys.exit("fake torchrun: unknown option " + name)
command = args if no_python else [sys.executable, *(["-m"] if module else []), *args]
ranks = {{"LOCAL_WORLD_SIZE": str(n), "WORLD_SIZE": str(n)}}
workers = [
    subprocess.Popen(command, env={{**os.environ, **ranks, "LOCAL_RANK": str(i), "RANK": str(i)}})
    for i in range(n)
]
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda s, _: [w.send_signal(s) for w in workers])
codes = [w.wait() for w in workers]
sys.exit(next((c for c in codes if c), 0))
"""


def test_torchrun_workers_are_each_an_mps_client_of_their_gpu(node: SimNode) -> None:
    """``mpswrap torchrun --nproc-per-node 4 -m MODULE`` in a batch script: every worker runs
    through the per-rank wrapper (``--no-python``, then torchrun's own interpreter and
    ``-m``), is an MPS client of the GPU its LOCAL_RANK places it on (not the batch step's
    ``SLURM_LOCALID=0`` every worker inherits), and the last one sums the run up."""
    fakes = node.root / "fakes"
    fakes.mkdir()
    torchrun = fakes / "torchrun"
    torchrun.write_text(FAKE_TORCHRUN.format(python=sys.executable))
    torchrun.chmod(0o755)
    rec = node.root / "rec.json"
    path = f"{fakes}:{node.env()['PATH']}"
    argv = ["torchrun", "--nproc-per-node", "4", "--standalone", "-m", "mpswrap.sim.client"]
    res = node.run(*argv, "--seconds", "2", "--record", str(rec), PATH=path, SLURM_LOCALID="0")
    assert res.returncode == 0, res.stderr
    starts = [r for r in records(rec) if r["event"] == "start"]
    assert len(starts) == 4 and all(r["mode"] == "mps" for r in starts), starts
    assert sorted(Path(r["pipe"]).parent.name for r in starts) == ["g0", "g0", "g1", "g1"]
    assert "4 ranks, 4 attached" in res.stderr, res.stderr
    dry = node.run("--dry-run", *argv, PATH=path)
    assert dry.returncode == 0, dry.stderr
    assert f"--no-python {sys.executable} -m mpswrap" in dry.stdout, dry.stdout
    assert f"-- {sys.executable} -m mpswrap.sim.client" in dry.stdout, dry.stdout


@pytest.mark.parametrize("dry", [False, True], ids=["launch", "dry-run"])
@pytest.mark.parametrize("launcher", ["torchrun", "prun", "mpirun"])
def test_a_launcher_this_host_lacks_is_127_before_anything_starts(
    node: SimNode, launcher: str, dry: bool
) -> None:
    """The launcher runs here: not on PATH, it is ``program not found`` and 127 as for a
    program in per-rank mode, before the launch line and any daemon, dry run or not (the
    dry run refuses as the launch would)."""
    (node.root / "empty").mkdir(exist_ok=True)
    argv = [*(["--dry-run"] if dry else []), launcher, "-n", "2", "true"]
    res = node.mpswrap(*argv, PATH=str(node.root / "empty"))
    assert (res.returncode, res.stderr) == (
        127,
        f"mpswrap: program not found ({launcher})\nhint: check the name and PATH\n",
    )
    assert not res.stdout
    assert not list(node.user_run_dir.rglob("*.json")), "a job was started"
