"""The launcher under a real Slurm (the harness of test_slurm_hooks.py): ``mpswrap srun``
prefix mode on two nodes with and without the prolog, and the faults only a real step shows
(the supervisor SIGKILLed, the job's time limit).

The simulated client records whether it attached, through which pipe directory, and how it
ended: ``terminated`` only when MPS terminate_client reached it before anything killed it.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

from mpswrap.paths import JobLayout
from tests.integration.harness import USER, Cluster, read_records, why_not_runnable
from tests.waits import wait_until

_skip = why_not_runnable()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(_skip is not None, reason=_skip or "")]
#: Slurm's default block distribution would put 7 of 8 tasks on node1.
EIGHT_ON_TWO = ("-N2", "-n8", "--ntasks-per-node=4")


#: The end-of-run summary a node's last rank prints (``mpswrap.report.summary``).
SUMMARY = re.compile(
    r"^mpswrap: summary: node (\S+): (.+), (\d+) ended by terminate_client, teardown (.+), "
    r"\d+\.\d\d s$",
    re.M,
)


def _prefix_srun(
    cluster: Cluster, workdir: Path, user_run: Path, name: str, *srun_args: str
) -> tuple[str, Any, dict[str, str]]:
    """``mpswrap srun ... client`` as the job user, outside any allocation: the job id, the
    clients' records, and the summary line of each node (what follows the node name)."""
    rec = workdir / "clients.jsonl"
    env = {"MPSWRAP_CONFIG": str(cluster.config_path), "MPSWRAP_USER_RUN_DIR": str(user_run)}
    argv = [cluster.python, "-m", "mpswrap", "srun", f"--job-name={name}", *srun_args]
    # 3 s: long enough for every rank's attach check to see its client.
    res = cluster.run_as(
        USER, [*argv, *cluster.client_argv(rec, seconds=3)], env=env, cwd=workdir, timeout=120
    )
    job_id = cluster.job_id(name)
    assert job_id is not None, res.stdout + res.stderr
    cluster.wait_gone(job_id)
    assert res.returncode == 0, res.stdout + res.stderr
    found = SUMMARY.findall(res.stdout + res.stderr)
    summaries = {node: ", ".join(rest) for node, *rest in found}
    assert len(found) == len(summaries), f"a node summed up twice: {found}"
    return job_id, read_records(rec), summaries


def _user_run(cluster: Cluster, tag: str) -> Path:
    """The job user's private run dir for user-mode daemons; short (MPS socket paths are
    limited to 107 bytes) and inside the cluster's state, so the leftover checks see it."""
    path = cluster.state / f"ur-{tag}"
    path.mkdir(mode=0o700)
    shutil.chown(path, USER, USER)
    return path


def test_prefix_srun_two_nodes_without_prolog_starts_user_daemons_and_leaves_none(
    cluster: Cluster, workdir: Path
) -> None:
    user_run = _user_run(cluster, "user")
    job, starts, summaries = _prefix_srun(
        cluster, workdir, user_run, "prefix-user", *EIGHT_ON_TWO, "--gres=gpu:2"
    )
    # One line per node, from the last of its 4 ranks; the user-mode daemons went with it.
    done = "4 ranks, 4 attached, exit codes 0, 0, clean"
    assert summaries == {"node1": done, "node2": done}, summaries
    assert len(starts) == 8 and all(s["mode"] == "mps" for s in starts), starts
    per_pipe = Counter(s["pipe"] for s in starts)
    layouts = [JobLayout(user_run, n, job) for n in ("node1", "node2")]
    expected = {str(layout.gpu(f"g{k}").pipe): 2 for layout in layouts for k in (0, 1)}
    assert dict(per_pipe) == expected
    assert len({s["server_pid"] for s in starts}) == 4, "two GPUs shared one MPS server"
    assert not any(layout.job_dir.exists() for layout in layouts)
    procs, dirs = cluster.wait_clean()
    assert not procs and not dirs, f"left behind: {procs} {dirs}"


def test_prefix_srun_two_nodes_with_prolog_attaches_and_starts_none(
    cluster: Cluster, workdir: Path
) -> None:
    user_run = _user_run(cluster, "prolog")
    job, starts, summaries = _prefix_srun(
        cluster, workdir, user_run, "prefix-prolog", *EIGHT_ON_TWO, "--gres=gpu:2", "--comment=mps"
    )
    done = "4 ranks, 4 attached, exit codes 0, 0, by the epilog"  # the prolog's daemons stay
    assert summaries == {"node1": done, "node2": done}, summaries
    assert len(starts) == 8 and all(s["mode"] == "mps" for s in starts), starts
    expected = {cluster.pipe(n, job, k): 2 for n in ("node1", "node2") for k in (0, 1)}
    assert dict(Counter(s["pipe"] for s in starts)) == expected
    assert not list(user_run.iterdir()), "a rank made user-mode state beside the prolog's"


def _wrapped_srun(cluster: Cluster, workdir: Path, name: str, *args: str) -> Any:
    """``srun ... mpswrap client`` (per-rank mode) on node1, 2 tasks on the prolog's daemon."""
    rec = workdir / "clients.jsonl"
    argv = ["env", f"MPSWRAP_CONFIG={cluster.config_path}", "srun", f"--job-name={name}"]
    argv += ["-w", "node1", "-n2", "--gres=gpu:1", "--comment=mps", *args]
    argv += [cluster.python, "-m", "mpswrap", *cluster.client_argv(rec, seconds=300)]
    srun = cluster.popen_as(USER, argv, cwd=workdir)
    try:
        wait_until(lambda: len(read_records(rec)) == 2, 30, "2 attached clients")
    except AssertionError:
        srun.kill()
        raise AssertionError(srun.communicate()[0]) from None
    return srun


def _ended(srun: Any) -> str:
    try:
        return str(srun.communicate(timeout=150)[0])
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()


def test_supervisor_sigkilled_its_client_is_still_ended_through_mps(
    cluster: Cluster, workdir: Path
) -> None:
    """SIGKILL takes one rank's supervisor: its guard must terminate_client the orphaned,
    shielded client (which would otherwise run on, or be killed mid-kernel by the step)."""
    rec = workdir / "clients.jsonl"
    srun = _wrapped_srun(cluster, workdir, "kill-supervisor")
    victim = read_records(rec)[0]["pid"]
    supervisor = psutil.Process(victim).parent()
    assert supervisor is not None, f"client {victim} has no parent"
    supervisor.kill()  # the client's supervisor, nothing else
    wait_until(lambda: read_records(rec, event="end"), 30, "the orphan's end")
    job_id = cluster.job_id("kill-supervisor")
    assert job_id is not None
    cluster.run_as(USER, ["scancel", job_id], check=True)
    out = _ended(srun)
    cluster.wait_gone(job_id)
    ends = {e["pid"]: e["reason"] for e in read_records(rec, event="end")}
    assert ends.get(victim) == "terminated", (ends, out)
    assert sorted(ends.values()) == ["terminated"] * 2, (ends, out)
    procs, dirs = cluster.wait_clean()
    assert not procs and not dirs, f"left behind: {procs} {dirs}"


def test_time_limit_ends_every_client_through_mps(cluster: Cluster, workdir: Path) -> None:
    """The time limit signals the whole step like scancel (then SIGKILL after KillWait)."""
    rec = workdir / "clients.jsonl"
    srun = _wrapped_srun(cluster, workdir, "time-limit", "--time=1")
    out = _ended(srun)
    job_id = cluster.job_id("time-limit")
    assert job_id is not None
    assert cluster.wait_gone(job_id, timeout=150) == "TIMEOUT", out
    ends = read_records(rec, event="end")
    assert sorted(e["reason"] for e in ends) == ["terminated"] * 2, (ends, out)
    procs, dirs = cluster.wait_clean()
    assert not procs and not dirs, f"left behind: {procs} {dirs}"


def _srun_verify_fail(
    cluster: Cluster, workdir: Path, name: str, *, tasks: int, rank1: str, seconds: float
) -> tuple[int, str, Path]:
    """``mpswrap --verify-attach fail srun -nTASKS`` as the job user, outside any allocation:
    rank 1 runs the shell words ``rank1`` first, every rank then the simulated client tagged
    with its rank. The exit code, the output, and the clients' records; the job is gone."""
    rec = workdir / "clients.jsonl"
    user_run = _user_run(cluster, name)
    env = {"MPSWRAP_CONFIG": str(cluster.config_path), "MPSWRAP_USER_RUN_DIR": str(user_run)}
    client = " ".join(cluster.client_argv(rec, seconds=seconds))
    script = f'if [ "$SLURM_PROCID" = 1 ]; then {rank1}; fi; exec {client} --tag "$SLURM_PROCID"'
    argv = [cluster.python, "-m", "mpswrap", "--verify-attach", "fail", "--verify-timeout", "3"]
    argv += ["srun", f"--job-name={name}", f"-n{tasks}", "--gres=gpu:1", "sh", "-c", script]
    res = cluster.run_as(USER, argv, env=env, cwd=workdir, timeout=90)
    out = res.stdout + res.stderr
    job_id = cluster.job_id(name)
    assert job_id is not None, out
    cluster.wait_gone(job_id)
    return res.returncode, out, rec


def test_verify_attach_fail_ends_every_task_of_the_step(cluster: Cluster, workdir: Path) -> None:
    """srun leaves a step's other tasks running when one fails; ``--verify-attach fail`` must
    still end the run: the refused rank exits 69 and the others end through terminate_client,
    long before their program would have."""
    nowhere = f"export CUDA_MPS_PIPE_DIRECTORY={workdir}/nowhere"
    code, out, rec = _srun_verify_fail(
        cluster, workdir, "verify-fail", tasks=3, rank1=nowhere, seconds=120
    )
    assert code != 0, out
    assert "rank 1 is not an MPS client" in out, out
    starts = read_records(rec)
    modes = {r["tag"]: r["mode"] for r in starts}
    assert modes == {"0": "mps", "1": "non-mps", "2": "mps"}, (modes, out)
    tags = {r["pid"]: r["tag"] for r in starts}  # end records name only the pid
    ends = {tags[e["pid"]]: e["reason"] for e in read_records(rec, event="end")}
    assert ends.get("0") == ends.get("2") == "terminated", (ends, out)
    procs, dirs = cluster.wait_clean()
    assert not procs and not dirs, f"left behind: {procs} {dirs}"


def test_a_programs_own_exit_code_69_leaves_the_other_tasks_running(
    cluster: Cluster, workdir: Path
) -> None:
    """69 is only mpswrap's word when its check refused a rank: a program that exits 69
    itself is one failed task, and srun's other tasks run to their end, as srun does."""
    code, out, rec = _srun_verify_fail(
        cluster, workdir, "own-69", tasks=2, rank1="exit 69", seconds=4
    )
    assert code == 69, out
    assert "ending the other tasks" not in out, out
    ends = [e["reason"] for e in read_records(rec, event="end")]
    assert ends == ["done"], (ends, out)
    procs, dirs = cluster.wait_clean()
    assert not procs and not dirs, f"left behind: {procs} {dirs}"
