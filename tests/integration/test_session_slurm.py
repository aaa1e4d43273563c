"""session() under a real Slurm: ``srun --mpi=pmix`` starts the mpi4py ranks (Open MPI over
Slurm's PMIx plugin), with the prolog's daemons and without them (user-mode, node leader).

The rank script is test_session_mpi.py's: enter the session, start a simulated CUDA client
that inherits the session's variables, check it attached, write what it saw.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mpswrap.paths import JobLayout
from tests.integration.harness import USER, Cluster, why_not_runnable
from tests.integration.test_session_mpi import RANK_SCRIPT

_skip = why_not_runnable()
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.mpi,
    pytest.mark.skipif(_skip is not None, reason=_skip or ""),
]
NP = 4


def _srun_session(
    cluster: Cluster, workdir: Path, path: str, *opts: str, user_run: Path | None = None
) -> tuple[str, dict[int, dict[str, object]], str]:
    script = workdir / "rank.py"
    script.write_text(RANK_SCRIPT)
    out = workdir / "out"
    out.mkdir()
    shutil.chown(out, USER, USER)
    env = {"MPSWRAP_CONFIG": str(cluster.config_path)}
    if user_run is not None:
        env["MPSWRAP_USER_RUN_DIR"] = str(user_run)
    name = f"session-{path}-{len(opts)}"
    argv = ["srun", f"--job-name={name}", "--mpi=pmix", "-w", "node1", f"-n{NP}"]
    argv += ["--gres=gpu:2", *opts, cluster.python, str(script), path, "ok", str(out)]
    res = cluster.run_as(USER, [*argv, cluster.sim.client], env=env, cwd=workdir, timeout=120)
    job = cluster.job_id(name)
    assert job is not None, res.stderr
    cluster.wait_gone(job)
    assert res.returncode == 0, res.stdout + res.stderr
    ranks = {int(p.stem): json.loads(p.read_text()) for p in out.glob("*.json")}
    return job, ranks, res.stdout + res.stderr


def _check(
    ranks: dict[int, dict[str, object]], pipes: list[str], uuids: list[str], mode: str
) -> None:
    assert sorted(ranks) == list(range(NP)), ranks
    for rank, info in ranks.items():
        pos = rank // 2  # block placement: ranks 0,1 -> GPU 0; 2,3 -> GPU 1
        assert (info["local_rank"], info["local_size"]) == (rank, NP), info
        assert info["uuid"] == info["cvd"] == uuids[pos], info
        assert info["pipe"] == info["env_pipe"] == pipes[pos], info
        assert (info["mode"], info["client_rc"]) == (mode, 0), info


@pytest.mark.parametrize("path", ["early", "comm"])
def test_session_under_srun_with_the_prologs_daemons(
    cluster: Cluster, workdir: Path, path: str
) -> None:
    job, ranks, out = _srun_session(cluster, workdir, path, "--comment=mps")
    pipes = [cluster.pipe("node1", job, k) for k in (0, 1)]
    _check(ranks, pipes, [cluster.gpu_uuid("node1", k) for k in (0, 1)], "prolog")
    procs, dirs = cluster.wait_clean()
    assert not procs and not dirs, f"left behind: {procs} {dirs}\n{out}"


def test_session_under_srun_without_prolog_starts_and_stops_user_daemons(
    cluster: Cluster, workdir: Path
) -> None:
    user_run = cluster.state / "ur-session"
    user_run.mkdir(mode=0o700)
    shutil.chown(user_run, USER, USER)
    job, ranks, out = _srun_session(cluster, workdir, "early", user_run=user_run)
    layout = JobLayout(user_run, "node1", job)
    pipes = [str(layout.gpu(f"g{k}").pipe) for k in (0, 1)]
    _check(ranks, pipes, [cluster.gpu_uuid("node1", k) for k in (0, 1)], "user")
    assert not layout.job_dir.exists(), "user-mode state outlived the job"
    procs, dirs = cluster.wait_clean()
    assert not procs and not dirs, f"left behind: {procs} {dirs}\n{out}"
