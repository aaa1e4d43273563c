"""The job's share of a node, under a real Slurm: each daemon runs on its GPU's CPUs among
the CPUs Slurm gave the job on that node, and a job with gres/mps shares of several GPUs gets
each GPU's own percentage.

Its own cluster: nodes that claim this machine's real CPUs (so Slurm's CPU ids are real ones),
task/cgroup with ``ConstrainCores=yes`` (so a task's CPUs are what Slurm enforces), and on
23.11+ ``MULTIPLE_SHARING_GRES_PJ`` (shares of several GPUs in one job). Both GPUs of the
simulated inventory are local to all CPUs: a daemon's CPUs are then exactly the job's.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import SAFE_PATH, Cluster, running_cluster, sh, why_not_runnable
from tests.waits import sh_wait_for_file

_skip = why_not_runnable()
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slurm_version,
    pytest.mark.skipif(_skip is not None, reason=_skip or ""),
]

CPUS = sorted(os.sched_getaffinity(0))


def _cgroup_conf() -> str:
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():  # cgroup v2 alone
        return "CgroupPlugin=cgroup/v2\\nIgnoreSystemd=yes\\nConstrainCores=yes\\n"
    return "CgroupPlugin=cgroup/v1\\nConstrainCores=yes\\n"


def _slurm_version() -> tuple[int, int]:
    text = sh(["slurmd", "-V"], env={"PATH": SAFE_PATH}).stdout  # needs no slurm.conf
    match = re.search(r"(\d+)\.(\d+)", text)
    assert match, text
    return int(match.group(1)), int(match.group(2))


@pytest.fixture(scope="module")
def shared(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    if _skip:
        pytest.skip(_skip)
    if len(CPUS) < 2:
        pytest.skip("needs 2 CPUs: two jobs, one CPU each")
    knobs = {
        "CPUS_PER_NODE": str(len(CPUS)),
        "TASK_PLUGIN": "task/cgroup,task/affinity",
        "PROCTRACK": "proctrack/cgroup",
        "CGROUP_CONF": _cgroup_conf(),
        # 23.11+: one job may hold gres/mps shares of several GPUs of a node.
        "SELECT_PARAMS": "CR_Core,MULTIPLE_SHARING_GRES_PJ"
        if _slurm_version() >= (23, 11)
        else "CR_Core",
    }
    with running_cluster(lambda: request.session.testsfailed > 0, knobs=knobs) as made:
        made.gpus_local_to(CPUS)
        yield made


def _daemon_cpus(cluster: Cluster, job: str) -> list[list[int]]:
    gpus = cluster.status(job, "node1")["gpus"]
    return [g["daemon"]["cpus"] for g in gpus]


def test_each_daemon_runs_on_the_jobs_cpus_of_its_node(shared: Cluster) -> None:
    """Two jobs of one CPU each on one node: each job's daemons run on that job's CPU alone,
    the CPU Slurm's cgroup gives the job's tasks, not on all of the GPU's CPUs."""
    work = shared.workdir("job-cpus")
    release = work / "release"  # the jobs run until the test has looked at both
    script = (
        "#!/bin/sh\ngrep Cpus_allowed_list /proc/self/status > {out}\n"
        f"{sh_wait_for_file(release)}\n"
    )
    jobs = []
    for i in range(2):
        out = work / f"cpus.{i}"
        jobs.append(
            shared.sbatch(
                script.replace("{out}", str(out)),
                "-w",
                "node1",
                "-n1",
                "--gres=mps:25",
                "--comment=mps",
                cwd=work,
            )
        )
    for i, job in enumerate(jobs):
        shared.wait_started(work / f"cpus.{i}", job)
    seen = {}
    for i, job in enumerate(jobs):
        task_cpus = (work / f"cpus.{i}").read_text().split(":", 1)[1].strip()
        cpus = _daemon_cpus(shared, job)
        assert cpus and all(c == cpus[0] for c in cpus), cpus
        seen[job] = (task_cpus, cpus[0])
    release.touch()
    for job in jobs:
        assert shared.wait_gone(job) == "COMPLETED"
    # Each job's daemon CPUs are the CPUs its tasks got from Slurm's cgroup: one CPU each,
    # a different one, where all of the GPU's CPUs were taken before.
    for task_cpus, daemon_cpus in seen.values():
        assert ",".join(map(str, daemon_cpus)) == task_cpus, seen
        assert len(daemon_cpus) == 1, seen
    assert len({tuple(d) for _, d in seen.values()}) == 2, seen


def test_shares_of_two_gpus_give_each_gpu_its_percentage(shared: Cluster) -> None:
    """23.11+: ``--gres=mps:150`` takes 100 of one GPU and 50 of the other; Slurm sets 150
    for the job, each daemon gets its own GPU's share, at most 100."""
    if _slurm_version() < (23, 11):
        pytest.skip("Slurm < 23.11 gives a job gres/mps of one GPU per node")
    work = shared.workdir("two-gpu-shares")
    release = work / "release"  # the job runs until the test has looked at it
    script = (
        "#!/bin/sh\necho $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE > {out}\n"
        f"{sh_wait_for_file(release)}\n"
    )
    out = work / "percentage"
    job = shared.sbatch(
        script.replace("{out}", str(out)), "-w", "node1", "-n1", "--gres=mps:150", cwd=work
    )
    shared.wait_started(out, job)
    gpus = shared.status(job, "node1")["gpus"]
    detail = shared.slurm("scontrol", "show", "job", "-d", job).stdout
    release.touch()
    assert shared.wait_gone(job) == "COMPLETED"
    assert out.read_text().strip() == "150"  # Slurm's one value for the job
    # Slurm's own split, by gres position: mps:150(100/100,50/100) -> g0 100, g1 50.
    pairs = re.search(r"GRES=mps:150\(([^)]*)\)", detail)
    assert pairs, detail
    wanted = {
        f"g{i}": 100 * int(used) / int(total)
        for i, (used, total) in enumerate(p.split("/") for p in pairs.group(1).split(","))
    }
    got = {g["key"]: g["settings"].get("active_thread_percentage") for g in gpus}
    assert got == wanted, json.dumps(gpus, indent=1)
    assert sorted(wanted.values()) == [50, 100], detail
