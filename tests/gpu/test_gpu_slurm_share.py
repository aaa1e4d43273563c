"""Issue-19 gpu tier: the SPANK flag and the job's CPUs, with the real MPS under a real Slurm.

The cluster of test_gpu_slurm.py (Debian 12's Slurm 22.05 carried as .debs, cgroup v2,
``task/cgroup`` with ``ConstrainCores=yes`` and ``ConstrainDevices=yes``), with gres/mps on the
GPU and mpswrap's SPANK plugin built on the machine by ``install.sh --spank`` (libslurm-dev
carried too) and named in plugstack.conf; ``opt_in = spank, gres-mps``.

- ``sbatch --mps=uniform -n 4 --gres=gpu:1`` (no comment, feature or gres/mps): its 4 tasks of
  a plain ``srun`` are MPS clients of the daemon the prolog started, each with 25 %.
- Two jobs of 4 CPUs each on the one GPU (``--gres=mps:50 --mps``), at once: each job's daemon
  runs on the GPU's NUMA-local CPUs among that job's CPUs: the CPUs Slurm's cgroup gives the
  job's tasks, not all of the GPU's 16.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mpswrap.jobenv import parse_int_list

from .conftest import gpu_inventory
from .test_gpu_slurm import (
    _as_user,
    _wait_job_gone,
    assert_job_left_nothing,
    slurm_cluster,
    submit,
    wait_clients,
)

pytestmark = pytest.mark.gpu
CLIENT = "/opt/mpswrap-site/cuda_client"  # run_gpu_tier.sh compiles it


@pytest.fixture(scope="module")
def cluster(gpu_user: str) -> Iterator[dict[str, str]]:
    with slurm_cluster(opt_in="spank, gres-mps", spank=True, SHARING="mps") as c:
        yield c


def _clients(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for g in status.get("gpus", []) for s in g["servers"] for c in s["clients"]]


def test_sbatch_mps_uniform_opts_in_and_gives_each_task_its_share(
    cluster: dict[str, str], gpu_user: str, mps_baseline: set[tuple[int, float]]
) -> None:
    help_text = _as_user(gpu_user, cluster, ["sbatch", "--help"], "/tmp").stdout
    assert "--mps=[policy]" in help_text, help_text[-600:]
    job = submit(
        cluster, gpu_user, "flag", "--mps=uniform -n 4 --gres=gpu:1", f"srun {CLIENT} --seconds 20"
    )
    status = wait_clients(job, cluster["config"], 4)
    print(json.dumps(status, indent=1))
    shares = sorted(c["active_thread_percentage"] for c in _clients(status))
    assert shares == [25, 25, 25, 25], shares
    _wait_job_gone(cluster, job)
    out = (Path(cluster["state"]) / "work" / "flag.out").read_text()
    print(out[-2000:])
    assert "CUDA error" not in out, out
    assert_job_left_nothing(cluster, job, mps_baseline)


def test_two_jobs_daemons_run_on_their_own_cpus(
    cluster: dict[str, str], gpu_user: str, mps_baseline: set[tuple[int, float]]
) -> None:
    work = Path(cluster["state"]) / "work"
    command = f"grep Cpus_allowed_list /proc/self/status > {{out}}\nsrun {CLIENT} --seconds 15"
    jobs = [
        submit(
            cluster,
            gpu_user,
            f"cpus{i}",
            "--mps -n 1 -c 4 --gres=mps:50",
            command.replace("{out}", str(work / f"cpus{i}.txt")),
        )
        for i in range(2)
    ]
    statuses = [wait_clients(job, cluster["config"], 1) for job in jobs]
    local = set(gpu_inventory().gpus[0].cpus)  # the GPU's NUMA-local CPUs (NVML)
    seen = []
    for i, status in enumerate(statuses):
        daemon = status["gpus"][0]["daemon"]["cpus"]
        task = (work / f"cpus{i}.txt").read_text().split(":", 1)[1].strip()
        seen.append((daemon, task))
        print(f"job {jobs[i]}: daemon cpus {daemon}, task Cpus_allowed_list {task}")
        assert len(daemon) == 4, daemon
        assert set(daemon) <= local, (daemon, local)
        assert set(parse_int_list(task)) == set(daemon), (task, daemon)
    assert not set(seen[0][0]) & set(seen[1][0]), seen
    for job in jobs:
        _wait_job_gone(cluster, job)
        assert_job_left_nothing(cluster, job, mps_baseline)


def test_plain_mps_flag_logs_no_error_in_any_step(
    cluster: dict[str, str], gpu_user: str, mps_baseline: set[tuple[int, float]]
) -> None:
    """``sbatch --mps`` with no policy: its batch step and its srun step run, attached, and
    slurmd's log gets no ``error: mpswrap`` line for any of the job's steps."""
    logs = sorted((Path(cluster["state"]) / "log").glob("slurmd*.log"))
    assert logs, f"no slurmd log in {cluster['state']}/log"
    since = {log: log.stat().st_size for log in logs}
    job = submit(
        cluster, gpu_user, "plain", "--mps -n 2 --gres=gpu:1", f"srun {CLIENT} --seconds 8"
    )
    wait_clients(job, cluster["config"], 2)
    _wait_job_gone(cluster, job)
    errors = []
    for log in logs:
        with log.open("rb") as f:
            f.seek(since[log])
            text = f.read().decode(errors="replace")
        errors += [f"{log.name}: {ln}" for ln in text.splitlines() if "error: mpswrap" in ln]
    print(f"job {job}: slurmd lines since submission checked in {[p.name for p in logs]}")
    assert not errors, errors
    out = (Path(cluster["state"]) / "work" / "plain.out").read_text()
    assert "CUDA error" not in out, out
    assert_job_left_nothing(cluster, job, mps_baseline)
