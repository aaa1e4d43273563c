"""What current Slurm changes for the hooks, under a real Slurm (the MPS simulator):

- ``PrologFlags=RunInJob`` (24.05+): slurmstepd of the job's extern step runs the prolog and
  the epilog inside the job. mpswrap starts the daemons in root's own cgroup all the same
  (one left in the extern step's would keep slurmstepd waiting at the job's end), so plain
  ``srun`` tasks attach to their GPU's daemon and the epilog, run last by that slurmstepd,
  leaves nothing.
- GPU UUIDs in ``CUDA_VISIBLE_DEVICES`` (26.05's ``gres.conf Flags=env_uuid``): a per-rank
  supervisor whose step names its GPU only by UUID attaches to that GPU's daemon. (The
  hooks' own UUID paths are tested without Slurm, in tests/functional/test_hook_contract.py.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import (
    SAFE_PATH,
    Cluster,
    read_records,
    running_cluster,
    sh,
    why_not_runnable,
)

_skip = why_not_runnable()
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slurm_version,
    pytest.mark.skipif(_skip is not None, reason=_skip or ""),
]


def _slurm_version() -> tuple[int, int]:
    text = sh(["slurmd", "-V"], env={"PATH": SAFE_PATH}).stdout
    match = re.search(r"(\d+)\.(\d+)", text)
    assert match, text
    return int(match.group(1)), int(match.group(2))


@pytest.fixture(scope="module")
def in_job(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    if _slurm_version() < (24, 5):
        pytest.skip("Slurm < 24.05 has no PrologFlags=RunInJob")
    knobs = {"PROLOG_FLAGS": "RunInJob"}
    with running_cluster(lambda: request.session.testsfailed > 0, knobs=knobs) as made:
        yield made


def test_run_in_job_starts_the_daemons_tasks_attach_and_nothing_is_left(
    in_job: Cluster,
) -> None:
    config = in_job.slurm("scontrol", "show", "config").stdout
    assert re.search(r"PrologFlags\s*=.*RunInJob", config), config
    work = in_job.workdir("run-in-job")
    rec = work / "clients.jsonl"
    opts = ["-w", "node1", "-N1", "-n4", "--gres=gpu:2", "--comment=mps"]
    job = in_job.srun(*opts, *in_job.client_argv(rec, seconds=1), cwd=work)
    assert job.proc is not None and job.proc.returncode == 0, job.output
    starts = read_records(rec)
    assert len(starts) == 4 and all(s["mode"] == "mps" for s in starts), starts
    pipes = {s["pipe"] for s in starts}
    assert pipes == {in_job.pipe("node1", job.id, 0), in_job.pipe("node1", job.id, 1)}, starts
    # The conftest checks after the test: no node drained, no process, job directory,
    # root's record or cgroup of the job left.


def test_a_step_that_names_its_gpu_by_uuid_attaches_to_that_gpus_daemon(
    cluster: Cluster, workdir: Path
) -> None:
    """A per-rank supervisor in a step whose only word for its GPU is its UUID (Slurm's GPU
    positions removed from its environment, ``CUDA_VISIBLE_DEVICES=<UUID>`` as env_uuid
    sets it): it finds the prolog's daemon of that very GPU."""
    uuid = cluster.gpu_uuid("node1", 1)
    rec = workdir / "clients.jsonl"
    program = [cluster.python, "-m", "mpswrap", "--", *cluster.client_argv(rec, seconds=1)]
    argv = ["env", "-u", "SLURM_STEP_GPUS", "-u", "SLURM_JOB_GPUS"]
    argv += ["-u", "CUDA_MPS_PIPE_DIRECTORY", f"CUDA_VISIBLE_DEVICES={uuid}", *program]
    opts = ["-w", "node1", "-N1", "-n1", "--gres=gpu:2", "--comment=mps"]
    job = cluster.srun(*opts, *argv, cwd=workdir)
    assert job.proc is not None and job.proc.returncode == 0, job.output
    (start,) = read_records(rec)
    assert start["mode"] == "mps", start
    assert start["pipe"] == cluster.pipe("node1", job.id, 1), start
    assert start["cvd"] == uuid, start
