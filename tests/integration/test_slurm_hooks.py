"""mpswrap's Slurm hooks under a real Slurm (22.05, two slurmd on this machine, fake GPUs,
the MPS simulator): what an admin gets from Prolog/TaskProlog/Epilog in slurm.conf.

Every job runs as the non-root user mpsuser. After every test the conftest checks that no
node is drained and that nothing of any job survived (processes, job directories).
The simulated client (``mps-sim-client``) records whether it attached to an MPS daemon, which
pipe directory it used and the CUDA_VISIBLE_DEVICES it saw.
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import (
    USER,
    Cluster,
    read_records,
    sh,
    why_not_runnable,
)
from tests.tree import PACKAGE
from tests.waits import sh_wait_for_file, wait_until

_skip = why_not_runnable()
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slurm_version,
    pytest.mark.skipif(_skip is not None, reason=_skip or ""),
]


def _starts(rec: Path, count: int, job: Any) -> list[dict[str, Any]]:
    starts = read_records(rec)
    assert len(starts) == count, f"{len(starts)} clients started, expected {count}\n{job}"
    return starts


def _check_attached(
    cluster: Cluster, starts: list[dict[str, Any]], job_id: str, expect: dict[tuple[str, int], int]
) -> None:
    """Each client attached (mode mps) to the daemon of its GPU: ``expect`` maps
    (node, gres position) -> number of clients there. The UUID a task sees must be the GPU
    whose device minor is the one gres.conf lists at that position, not NVML index order."""
    assert all(s["mode"] == "mps" for s in starts), starts
    by_gpu: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    pipes = {cluster.pipe(n, job_id, k): (n, k) for n, k in expect}
    for s in starts:
        assert s["pipe"] in pipes, f"client used pipe {s['pipe']}, expected one of {list(pipes)}"
        by_gpu[pipes[s["pipe"]]].append(s)
    assert {k: len(v) for k, v in by_gpu.items()} == expect
    servers = set()
    for (node, position), clients in by_gpu.items():
        assert {c["cvd"] for c in clients} == {cluster.gpu_uuid(node, position)}, clients
        server = {c["server_pid"] for c in clients}
        assert len(server) == 1, f"clients of {node} g{position} on several servers: {clients}"
        servers |= server
    assert len(servers) == len(expect), "two GPUs shared one MPS server"


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


# --------------------------------------------------------------------------------------------
def test_cluster_smoke(cluster: Cluster) -> None:
    """The harness itself: both nodes run a job of the non-root user, hooks configured."""
    config = cluster.slurm("scontrol", "show", "config").stdout
    for key, hook in (("Prolog", "prolog"), ("Epilog", "epilog"), ("TaskProlog", "task_prolog")):
        assert f"{cluster.hooks / hook}" in config, f"{key} not set to {cluster.hooks / hook}"
    job = cluster.srun("-N2", "-n2", "hostname")
    assert job.proc is not None and job.proc.returncode == 0, job.output
    names = sorted(job.proc.stdout.split())
    assert len(names) == 2, job.output
    if cluster.isolate != "none":
        assert names == ["node1", "node2"]
    # The fake inventory must tell gres positions from NVML indices apart, or the GPU
    # mapping tests below could pass by accident.
    assert cluster.gpu_uuid("node1", 0) != cluster.inventory()[0]["uuid"]


def test_srun_tasks_attach_through_task_prolog(cluster: Cluster, workdir: Path) -> None:
    rec = workdir / "clients.jsonl"
    opts = ["-w", "node1", "-N1", "-n4", "--gres=gpu:2", "--comment=mps"]
    job = cluster.srun(*opts, *cluster.client_argv(rec, seconds=1), cwd=workdir)
    assert job.proc is not None and job.proc.returncode == 0, job.output
    starts = _starts(rec, 4, job.output)
    _check_attached(cluster, starts, job.id, {("node1", 0): 2, ("node1", 1): 2})


def test_sbatch_steps_attach_and_batch_mpirun_is_not_pinned(
    cluster: Cluster, workdir: Path
) -> None:
    """srun steps of a batch job attach like plain srun; the batch step gets no exports, so
    an mpirun started by the script keeps every GPU (ranks pick their own)."""
    if shutil.which("mpirun") is None:
        pytest.skip("needs Open MPI mpirun")
    if cluster.isolate == "none":
        pytest.skip("needs ISOLATE=uts: without own hostnames mpirun starts an orted via srun")
    rec = workdir / "clients.jsonl"
    script = f"""#!/bin/sh
env > {workdir}/batch.env
srun {cluster.sim.client} --seconds 1 --record {rec}
echo "srun=$?"
mpirun -np 2 sh -c 'env > {workdir}/rank.$OMPI_COMM_WORLD_RANK.env'
echo "mpirun=$?"
"""
    opts = ["-w", "node1", "-N1", "-n4", "--gres=gpu:2", "--comment=mps"]
    job_id = cluster.sbatch(script, *opts, cwd=workdir)
    state = cluster.wait_gone(job_id)
    out = (workdir / f"slurm-{job_id}.out").read_text()
    assert state == "COMPLETED", out
    assert "srun=0" in out and "mpirun=0" in out, out
    _check_attached(cluster, _starts(rec, 4, out), job_id, {("node1", 0): 2, ("node1", 1): 2})
    for env_file in [workdir / "batch.env", workdir / "rank.0.env", workdir / "rank.1.env"]:
        env = _env_file(env_file)
        assert "CUDA_MPS_PIPE_DIRECTORY" not in env, f"{env_file.name} got MPS exports"
        assert env.get("CUDA_VISIBLE_DEVICES") == "0,1", f"{env_file.name} pinned: {env}"


def test_sbatch_multinode_mpirun_is_not_pinned(cluster: Cluster, workdir: Path) -> None:
    """mpirun in a 2-node batch job starts its remote ranks through an orted that Open MPI
    launches with srun (a real step of one task per node): the task prolog must not pin
    those ranks either (seen on 22.05 + Open MPI 4.1: it did)."""
    if shutil.which("mpirun") is None:
        pytest.skip("needs Open MPI mpirun")
    script = f"""#!/bin/sh
mpirun -np 4 --map-by node sh -c 'env > {workdir}/rank.$OMPI_COMM_WORLD_RANK.env'
echo "mpirun=$?"
"""
    opts = ["-N2", "--ntasks-per-node=2", "--gres=gpu:2", "--comment=mps"]
    job_id = cluster.sbatch(script, *opts, cwd=workdir)
    state = cluster.wait_gone(job_id)
    out = (workdir / f"slurm-{job_id}.out").read_text()
    assert state == "COMPLETED" and "mpirun=0" in out, out
    envs = {f.name: _env_file(f) for f in sorted(workdir.glob("rank.*.env"))}
    assert len(envs) == 4, out
    assert {e.get("SLURMD_NODENAME") for e in envs.values()} == {"node1", "node2"}
    pinned = {
        name: (e.get("SLURMD_NODENAME"), e.get("CUDA_VISIBLE_DEVICES"))
        for name, e in envs.items()
        if "CUDA_MPS_PIPE_DIRECTORY" in e
    }
    assert not pinned, f"mpirun ranks got the task prolog's MPS exports: {pinned}"


def test_gres_mps_25_sets_default_active_thread_percentage(cluster: Cluster, workdir: Path) -> None:
    started = workdir / "started"
    script = f"#!/bin/sh\ntouch {started}\nsleep 60\n"
    job_id = cluster.sbatch(script, "-w", "node1", "--gres=mps:25", cwd=workdir)
    cluster.wait_started(started, job_id)  # the batch script runs after the prolog
    status = cluster.status(job_id, "node1")
    cluster.slurm("scancel", job_id)
    cluster.wait_gone(job_id)
    assert len(status["gpus"]) == 1, json.dumps(status, indent=1)
    gpu = status["gpus"][0]
    assert gpu["daemon"]["alive"] and gpu["daemon"]["started_by"] == "prolog", gpu
    assert gpu["default_active_thread_percentage"] == 25.0, gpu
    assert gpu["servers"] == [], "a server runs before the first client"


def test_job_without_opt_in_gets_no_daemon(cluster: Cluster, workdir: Path) -> None:
    rec = workdir / "clients.jsonl"
    probe = (
        f"test -e {cluster.run_dir}/node1/$SLURM_JOB_ID && echo dir=yes || echo dir=no; "
        'echo "pipe=${CUDA_MPS_PIPE_DIRECTORY-unset}"; echo "cvd=$CUDA_VISIBLE_DEVICES"; '
        f"{cluster.sim.client} --seconds 0.2 --record {rec}"
    )
    job = cluster.srun("-w", "node1", "-n1", "--gres=gpu:1", "sh", "-c", probe, cwd=workdir)
    assert job.proc is not None and job.proc.returncode == 0, job.output
    assert "dir=no" in job.proc.stdout and "pipe=unset" in job.proc.stdout, job.output
    assert "cvd=GPU-" not in job.proc.stdout, job.output
    assert [s["mode"] for s in _starts(rec, 1, job.output)] == ["non-mps"]


def test_concurrent_jobs_have_separate_daemons(cluster: Cluster, workdir: Path) -> None:
    """Two jobs sharing node1 (gres/mps:50 each): a daemon each; the first job's epilog
    leaves the second job's daemon and client alone."""
    recs = {name: workdir / f"{name}.jsonl" for name in ("long", "short")}
    ids = {}
    for name, seconds in (("long", 10), ("short", 1)):
        script = f"#!/bin/sh\nsrun {' '.join(cluster.client_argv(recs[name], seconds))}\n"
        ids[name] = cluster.sbatch(script, "-w", "node1", "-n1", "--gres=mps:50", cwd=workdir)
    wait_until(lambda: all(read_records(r) for r in recs.values()), 30, "both clients to start")
    assert cluster.wait_gone(ids["short"]) == "COMPLETED"
    # The short job's epilog has run: the long job's daemon and client are untouched.
    status = cluster.status(ids["long"], "node1")
    assert [g["daemon"]["alive"] for g in status["gpus"]] == [True], status
    assert not read_records(recs["long"], "end"), "the long job's client ended early"
    assert cluster.wait_gone(ids["long"]) == "COMPLETED"
    long_start, short_start = read_records(recs["long"])[0], read_records(recs["short"])[0]
    assert long_start["mode"] == short_start["mode"] == "mps"
    assert long_start["pipe"] == cluster.pipe("node1", ids["long"], _gres_position(long_start))
    assert short_start["pipe"] != long_start["pipe"]
    assert short_start["server_pid"] != long_start["server_pid"]
    assert [e["reason"] for e in read_records(recs["long"], "end")] == ["done"]


def _gres_position(start: dict[str, Any]) -> int:
    """The gres position of the pipe dir a client used (``.../g<k>/pipe``)."""
    return int(Path(start["pipe"]).parent.name[1:])


def test_two_node_job_has_daemons_on_both_nodes(cluster: Cluster, workdir: Path) -> None:
    rec = workdir / "clients.jsonl"
    opts = ["-N2", "--ntasks-per-node=2", "--gres=gpu:2", "--comment=mps"]
    job = cluster.srun(*opts, *cluster.client_argv(rec, seconds=1), cwd=workdir)
    assert job.proc is not None and job.proc.returncode == 0, job.output
    every_gpu = {(n, k): 1 for n in ("node1", "node2") for k in (0, 1)}
    _check_attached(cluster, _starts(rec, 4, job.output), job.id, every_gpu)


def test_scancel_of_plain_srun_is_cleaned_up_by_epilog(cluster: Cluster, workdir: Path) -> None:
    rec = workdir / "clients.jsonl"
    name = "scancel-me"
    opts = f"--job-name={name} -w node1 -n2 --gres=gpu:1 --comment=mps".split()
    argv = ["srun", *opts, *cluster.client_argv(rec, seconds=300)]
    srun = cluster.popen_as(USER, argv, cwd=workdir)
    try:
        wait_until(lambda: len(read_records(rec)) == 2, 30, "2 attached clients")
        job_id = cluster.job_id(name)
        assert job_id is not None
        assert (cluster.run_dir / "node1" / job_id).is_dir()
        cluster.run_as(USER, ["scancel", job_id], check=True)
        srun.wait(timeout=60)
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()
        if srun.stdout:
            srun.stdout.close()
    assert cluster.wait_gone(job_id) == "CANCELLED"
    assert all(s["mode"] == "mps" for s in read_records(rec))
    procs, dirs = cluster.wait_clean()
    assert not procs and not dirs, f"left behind: {procs} {dirs}"


def test_prolog_failure_drains_node_with_reason(cluster: Cluster, workdir: Path) -> None:
    with cluster.config(prolog_failure="drain"), cluster.faults({"start": "fail"}):
        try:
            opts = ["-w", "node1", "-n1", "--gres=gpu:1", "--comment=mps"]
            job = cluster.srun(*opts, "true", cwd=workdir)
            assert job.proc is not None and job.proc.returncode != 0, job.output
            drained = wait_until(
                lambda: [line for line in cluster.drained_nodes() if line.startswith("node1 ")],
                30,
                "node1 to drain",
            )
            assert "mpswrap" in drained[0], f"drain reason does not name mpswrap: {drained}"
            assert not cluster.job_dirs()
        finally:
            cluster.resume_all()


def test_prolog_failure_continue_runs_job_without_mps(cluster: Cluster, workdir: Path) -> None:
    rec = workdir / "clients.jsonl"
    with cluster.config(prolog_failure="continue"), cluster.faults({"start": "fail"}):
        opts = ["-w", "node1", "-n1", "--gres=gpu:1", "--comment=mps"]
        job = cluster.srun(*opts, *cluster.client_argv(rec, seconds=0.2), cwd=workdir)
    assert job.proc is not None and job.proc.returncode == 0, job.output
    assert [s["mode"] for s in _starts(rec, 1, job.output)] == ["non-mps"]
    assert not cluster.drained_nodes()


def test_uninstall_refuses_while_slurm_conf_names_the_hooks(cluster: Cluster) -> None:
    """``uninstall-hooks`` reads ``scontrol show config`` (22.05: ``Prolog  = ...``; 24.11:
    ``Prolog[0] = ...``) and removes nothing while slurm.conf names the shims."""
    res = sh(
        ["bash", str(PACKAGE / "slurm" / "uninstall.sh"), "--dest", str(cluster.hooks)],
        env=cluster.env(),
        check=False,
    )
    assert res.returncode != 0, res.stdout + res.stderr
    assert "slurm.conf still points at" in res.stderr, res.stderr
    for name in ("prolog", "task_prolog", "epilog", "mpswrap_spank.so"):
        assert (cluster.hooks / name).exists(), f"{name} was removed"


def _compute_modes(cluster: Cluster) -> dict[str, str]:
    return {g["uuid"]: g.get("compute_mode", "DEFAULT") for g in cluster.inventory()}


def test_exclusive_process_for_whole_gpus_and_back_after_the_job(
    cluster: Cluster, workdir: Path
) -> None:
    """``exclusive_process = yes`` (simulator only): a job's whole GPU is EXCLUSIVE_PROCESS
    while it runs and DEFAULT again after its epilog; a gres/mps job's GPU keeps its mode."""
    marker, release = workdir / "running", workdir / "release"
    # Each job runs until the test has looked at it: it ends once the release file is there.
    script = f"#!/bin/sh\ntouch {marker}\n{sh_wait_for_file(release)}\n"
    with cluster.config(exclusive_process="yes"):
        job = cluster.sbatch(script, "-w", "node1", "--gres=gpu:1", "--comment=mps", cwd=workdir)
        cluster.wait_started(marker, job)
        during = _compute_modes(cluster)
        release.touch()
        assert cluster.wait_gone(job) == "COMPLETED"
        after = _compute_modes(cluster)
        marker.unlink()
        release.unlink()
        shared = cluster.sbatch(script, "-w", "node1", "--gres=mps:50", cwd=workdir)
        cluster.wait_started(marker, shared)
        during_shared = _compute_modes(cluster)
        release.touch()
        assert cluster.wait_gone(shared) == "COMPLETED"
    assert sorted(during.values()) == ["DEFAULT", "EXCLUSIVE_PROCESS"], during
    assert set(after.values()) == {"DEFAULT"}, after
    assert set(during_shared.values()) == {"DEFAULT"}, during_shared
    assert not list(cluster.run_dir.glob("compute-mode.*")), "the kept mode was not removed"
