"""Reliability and isolation under a real Slurm with the hooks installed: two users, load,
and concurrency. The conftest fails any test that leaves a drained node or a leftover."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.integration.harness import (
    USER,
    USER2,
    Cluster,
    read_records,
    why_not_runnable,
)
from tests.promcheck import exposition_problems
from tests.waits import wait_until

_skip = why_not_runnable()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(_skip is not None, reason=_skip or "")]
#: CI runs a reduced load; set MPS_LOAD_JOBS=100 for the full run of docs/reliability.md.
LOAD_JOBS = int(os.environ.get("MPS_LOAD_JOBS", "30"))


def test_second_user_cannot_reach_another_jobs_daemon(cluster: Cluster, workdir: Path) -> None:
    rec = workdir / "clients.jsonl"
    name = "isolated"
    argv = [
        "srun",
        f"--job-name={name}",
        "-w",
        "node1",
        "-n1",
        "--gres=gpu:1",
        "--comment=mps",
        *cluster.client_argv(rec, seconds=300),
    ]
    srun = cluster.popen_as(USER, argv, cwd=workdir)
    try:
        wait_until(lambda: len(read_records(rec)) == 1, 30, "the job's client")
        job_id = cluster.job_id(name)
        assert job_id is not None
        pipe = cluster.pipe("node1", job_id, 0)
        other = cluster.workdir("other", user=USER2)
        env = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": str(other)}
        # query, and quit: both refused (the job directory is 0700, owned by the job user)
        for command in ("get_server_list", "quit"):
            res = cluster.run_as(USER2, [cluster.sim.control, command], env=env)
            assert res.returncode != 0
            assert "Cannot find MPS control daemon process" in res.stdout + res.stderr
        # mpswrap status of another user's job shows nothing of it
        status = cluster.mpswrap(
            USER2,
            "status",
            "--json",
            "--run-dir",
            str(cluster.run_dir),
            "--node",
            "node1",
            "--job",
            job_id,
        )
        assert "GPU-" not in status.stdout
        # a client of the second user pointed at the pipe dir silently runs without MPS
        rec2 = other / "intruder.jsonl"
        res = cluster.run_as(USER2, cluster.client_argv(rec2, seconds=0.2), env=env)
        assert res.returncode == 0, res
        assert [r["mode"] for r in read_records(rec2)] == ["non-mps"]
        # and the job's daemon is unharmed: its client is still attached, listed by the owner
        listed = cluster.status(job_id, "node1")
        clients = [c for g in listed["gpus"] for s in g["servers"] for c in s["clients"]]
        assert len(clients) == 1
        # its metrics, as its user and as root: the job, its GPU and the rank, no process
        where = ["--run-dir", str(cluster.run_dir), "--node", "node1", "--job", job_id]
        for who in (USER, "root"):
            out = cluster.mpswrap(who, "metrics", "--config", str(cluster.config_path), *where)
            assert out.returncode == 0, out.stderr
            assert exposition_problems(out.stdout) == [], out.stdout
            rows = [line for line in out.stdout.splitlines() if line.startswith("mpswrap_clients")]
            assert len(rows) == 1 and f'job_id="{job_id}"' in rows[0], out.stdout
            assert 'rank="0",task=""} 1' in rows[0], rows
        cluster.run_as(USER, ["scancel", job_id], check=True)
        srun.wait(timeout=60)
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()
        if srun.stdout:
            srun.stdout.close()
    cluster.wait_gone(job_id)


@pytest.mark.slurm_version  # CI's other Slurm versions run it short (MPS_LOAD_JOBS)
@pytest.mark.timeout(60 + 4 * LOAD_JOBS)
def test_back_to_back_jobs_leave_nothing(cluster: Cluster, workdir: Path) -> None:
    """LOAD_JOBS jobs with the hooks, one after the other (MPS_LOAD_JOBS, default 30)."""
    rec = workdir / "load.jsonl"
    started = time.monotonic()
    for _ in range(LOAD_JOBS):
        job = cluster.srun(
            "-N1",
            "-n2",
            "--gres=gpu:2",
            "--comment=mps",
            *cluster.client_argv(rec, seconds=0.05),
            cwd=workdir,
        )
        assert job.proc is not None and job.proc.returncode == 0, job.output
    took = time.monotonic() - started
    starts = read_records(rec)
    assert len(starts) == 2 * LOAD_JOBS
    assert all(s["mode"] == "mps" for s in starts)
    procs, dirs = cluster.wait_clean(timeout=30)
    assert not procs and not dirs, f"left behind: {procs} {dirs}"
    assert not cluster.drained_nodes()
    print(f"{LOAD_JOBS} back-to-back jobs in {took:.1f} s ({took / LOAD_JOBS:.2f} s per job)")


def test_four_concurrent_jobs_per_node(cluster: Cluster, workdir: Path) -> None:
    rec = workdir / "concurrent.jsonl"
    procs = []
    for node in ("node1", "node2"):
        for i in range(4):
            argv = [
                "srun",
                f"--job-name=conc-{node}-{i}",
                "-w",
                node,
                "-n1",
                "-c1",
                "--gres=mps:25",
                # long enough that the jobs overlap however Slurm staggers their starts
                *cluster.client_argv(rec, seconds=5),
            ]
            procs.append(cluster.popen_as(USER, argv, cwd=workdir))
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    starts = read_records(rec)
    assert len(starts) == 8
    assert all(s["mode"] == "mps" for s in starts)
    assert len({s["pipe"] for s in starts}) == 8, "two jobs shared a daemon"
    ends = {e["pid"]: e for e in read_records(rec, event="end")}
    assert sorted(e["reason"] for e in ends.values()) == ["done"] * 8, ends
    t0 = min(s["time"] for s in starts)
    for node in ("node1", "node2"):  # pipe: run_dir/<node>/<job>/g0/pipe
        spans = [
            (s["time"] - t0, ends[s["pid"]]["time"] - t0)
            for s in starts
            if Path(s["pipe"]).parts[-4] == node
        ]
        print(node, [f"{a:.2f}-{b:.2f}" for a, b in sorted(spans)])
        # The four jobs ran at one moment: the node's last client started before its first ended.
        assert len(spans) == 4 and max(a for a, _ in spans) < min(b for _, b in spans), spans
    procs_left, dirs = cluster.wait_clean(timeout=30)
    assert not procs_left and not dirs


def test_scancel_under_srun_mpswrap_terminates_clients_before_any_kill(
    cluster: Cluster, workdir: Path
) -> None:
    """scancel signals every process of the step at once; each per-rank supervisor must end
    its client through terminate_client (client end record: "terminated") before any kill."""
    rec = workdir / "clients.jsonl"
    name = "scancel-wrapped"
    # The admin config lives in the cluster's state dir here (/etc/mpswrap on a real node).
    argv = [
        "env",
        f"MPSWRAP_CONFIG={cluster.config_path}",
        "srun",
        f"--job-name={name}",
        "-w",
        "node1",
        "-n4",
        "--gres=gpu:2",
        "--comment=mps",
        cluster.python,
        "-m",
        "mpswrap",
        *cluster.client_argv(rec, seconds=300),
    ]
    srun = cluster.popen_as(USER, argv, cwd=workdir)
    try:
        try:
            wait_until(lambda: len(read_records(rec)) == 4, 30, "4 attached clients")
        except AssertionError:
            srun.kill()
            raise AssertionError(srun.communicate()[0]) from None
        job_id = cluster.job_id(name)
        assert job_id is not None
        cluster.run_as(USER, ["scancel", job_id], check=True)
        out, _ = srun.communicate(timeout=60)
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()
    cluster.wait_gone(job_id)
    ends = read_records(rec, event="end")
    assert sorted(e["reason"] for e in ends) == ["terminated"] * 4, (ends, out)
    procs, dirs = cluster.wait_clean()
    assert not procs and not dirs, f"left behind: {procs} {dirs}"
