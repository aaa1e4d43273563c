"""The SPANK plugin (mpswrap/slurm/mpswrap_spank.c) under a real Slurm: ``--mps[=POLICY]`` on
sbatch, salloc and srun opts a job in to the prolog's MPS with no gres/mps, comment or
feature, and its policy sets each task's share of the GPU.

The harness builds the plugin with ``install.sh --spank`` against the running Slurm's headers
(22.05 on Debian 12, 24.11 in tools/slurm-trixie.sh's Debian 13 root) and names it in
plugstack.conf, as slurm/README.md tells an admin to.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import Cluster, read_records, why_not_runnable
from tests.waits import wait_until

_skip = why_not_runnable()
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slurm_version,
    pytest.mark.skipif(_skip is not None, reason=_skip or ""),
]

#: Each task records the share it was given, then runs the simulated CUDA program.
SHARE = (
    "echo ${SLURM_PROCID}=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-none} >> {out}; "
    "exec {client} --seconds 0.5 --record {rec}"
)


def _task(cluster: Cluster, workdir: Path) -> list[str]:
    text = SHARE.replace("{out}", str(workdir / "shares")).replace("{client}", cluster.sim.client)
    text = text.replace("{rec}", str(workdir / "clients.jsonl"))
    return ["sh", "-c", text]


def _shares(workdir: Path) -> dict[str, str]:
    lines = (workdir / "shares").read_text().split()
    return dict(line.split("=", 1) for line in lines)


def _modes(workdir: Path) -> set[str]:
    return {s["mode"] for s in read_records(workdir / "clients.jsonl")}


def test_the_plugin_adds_mps_to_sbatch_salloc_and_srun(cluster: Cluster) -> None:
    for command in ("sbatch", "salloc", "srun"):
        text = cluster.slurm(command, "--help").stdout
        assert "--mps=[policy]" in text, f"{command} --help lists no --mps:\n{text[-800:]}"


def test_sbatch_mps_opts_a_job_in_and_a_job_without_it_is_left_alone(
    cluster: Cluster, workdir: Path
) -> None:
    """prolog_mode = opt-in: ``--mps`` alone (no gres/mps, comment or feature) gets the job
    its daemons; the same job without it runs as Slurm set it up."""
    task = " ".join(f"'{a}'" for a in _task(cluster, workdir))
    script = f"#!/bin/sh\nsrun {task}\n"
    opts = ["-w", "node1", "-N1", "-n2", "--gres=gpu:1"]
    with_flag = cluster.sbatch(script, *opts, "--mps", cwd=workdir)
    assert cluster.wait_gone(with_flag) == "COMPLETED", workdir / f"slurm-{with_flag}.out"
    assert _modes(workdir) == {"mps"}
    starts = read_records(workdir / "clients.jsonl")
    assert {s["pipe"] for s in starts} <= {cluster.pipe("node1", with_flag, p) for p in (0, 1)}
    # A plain --mps keeps Slurm's and the admin's defaults: no per-task share.
    assert set(_shares(workdir).values()) == {"none"}

    for name in ("clients.jsonl", "shares"):
        (workdir / name).unlink()
    without = cluster.sbatch(script, *opts, cwd=workdir)
    assert cluster.wait_gone(without) == "COMPLETED", workdir / f"slurm-{without}.out"
    assert _modes(workdir) == {"non-mps"}


@pytest.mark.parametrize(("policy", "tasks", "share"), [("uniform", 4, "25"), ("40", 2, "40")])
def test_the_policy_sets_each_tasks_share(
    cluster: Cluster, workdir: Path, policy: str, tasks: int, share: str
) -> None:
    """``srun --mps=POLICY`` (a job made by srun): each task of the step gets the share the
    policy gives it among the step's tasks on its GPU, through the task prolog."""
    job = cluster.srun(
        "-w",
        "node1",
        "-N1",
        f"-n{tasks}",
        "--gres=gpu:1",
        f"--mps={policy}",
        *_task(cluster, workdir),
        cwd=workdir,
    )
    assert job.proc is not None and job.proc.returncode == 0, job.output
    assert _modes(workdir) == {"mps"}
    assert _shares(workdir) == {str(rank): share for rank in range(tasks)}


@pytest.mark.parametrize("policy", ["fast", "0", "101", "2:-1", "1..5", "x" * 80])
def test_a_bad_policy_is_refused_at_submission(
    cluster: Cluster, workdir: Path, policy: str
) -> None:
    res = cluster.run_as(
        "mpsuser",
        ["sbatch", "--parsable", f"--mps={policy}", "--gres=gpu:1", "--wrap", "true"],
        cwd=workdir,
        check=False,
    )
    assert res.returncode != 0, res.stdout
    assert "mpswrap: bad --mps policy" in res.stderr, res.stderr
    assert not cluster.queue(), "a job with a bad --mps policy was queued"


def _log_sizes(cluster: Cluster) -> dict[Path, int]:
    return {log: log.stat().st_size for log in (cluster.state / "log").glob("slurmd*.log")}


def _mpswrap_errors(cluster: Cluster, since: dict[Path, int]) -> list[str]:
    """slurmd's and slurmstepd's ``error: mpswrap`` lines logged after ``since``."""
    found = []
    for log in sorted((cluster.state / "log").glob("slurmd*.log")):
        with log.open("rb") as f:
            f.seek(since.get(log, 0))
            text = f.read().decode(errors="replace")
        found += [f"{log.name}: {ln}" for ln in text.splitlines() if "error: mpswrap" in ln]
    return found


def test_a_plain_mps_logs_no_error_in_any_step(cluster: Cluster, workdir: Path) -> None:
    """A plain ``--mps`` has no value: sbatch's batch step and an srun step in it, an srun
    job's step and an salloc job's step log no ``error: mpswrap`` line (the batch step once
    logged ``bad --mps policy ''``, on 22.05 and on the H100)."""
    since = _log_sizes(cluster)
    assert since, f"no slurmd log in {cluster.state / 'log'}"
    opts = ["-w", "node1", "-N1", "--gres=gpu:1", "--mps"]
    job = cluster.sbatch("#!/bin/sh\nsrun true\n", *opts, cwd=workdir)
    assert cluster.wait_gone(job) == "COMPLETED", workdir / f"slurm-{job}.out"
    ran = cluster.srun(*opts, "true", cwd=workdir)
    assert ran.proc is not None and ran.proc.returncode == 0, ran.output
    res = cluster.run_as("mpsuser", ["salloc", *opts, "srun", "true"], cwd=workdir, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    wait_until(lambda: not cluster.queue(), 30, "the salloc job to end")
    assert not _mpswrap_errors(cluster, since), _mpswrap_errors(cluster, since)
