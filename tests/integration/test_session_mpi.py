"""session() under a real ``mpirun -np 4`` on 2 fake GPUs (Open MPI, mpi4py, MPS simulator).

Each rank runs a small script: enter the session (before MPI, or after it), start a fake CUDA
process (the simulator's client, which inherits the session's variables), check it attached,
write what it saw. Every test ends with no process mentioning its private root.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpswrap.paths import JobLayout
from tests.functional.test_session import NODE, Sim, finish_sim, make_sim
from tests.tree import REPO

MPIRUN = shutil.which("mpirun")
pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(MPIRUN is None, reason="needs Open MPI mpirun"),
]
JOB = "77"
NP = 4
LIMIT = 60  # seconds: a job that hangs fails the test instead of the suite

RANK_SCRIPT = """
import json, os, subprocess, sys
from pathlib import Path

path, action, out, client = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
if path == "comm":
    from mpi4py import MPI  # MPI initialised before the session: the node-leader path
from mpswrap import session

with session() as s:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    child = subprocess.Popen([client, "--seconds", "1"], env=dict(os.environ))
    s.check_attached(pid=child.pid, timeout=30)
    seen = dict(rank=rank, local_rank=s.local_rank, local_size=s.local_size, uuid=s.gpu_uuid,
                pipe=str(s.pipe_dir), mode=s.mode, client_rc=child.wait(60),
                env_pipe=os.environ["CUDA_MPS_PIPE_DIRECTORY"],
                cvd=os.environ["CUDA_VISIBLE_DEVICES"], mpi_before=path == "comm")
    (out / f"{rank}.json").write_text(json.dumps(seen))
    if action == "raise" and rank == 1:
        raise RuntimeError("boom on rank 1")
    if action == "abort" and rank == 2:
        comm.Abort(3)
    comm.Barrier()  # the other ranks wait here: only MPI_Abort can end them
"""


@pytest.fixture
def sim() -> Iterator[Sim]:
    made = make_sim(gpus=2)
    try:
        yield made
    finally:
        finish_sim(made)


def _env(sim: Sim) -> dict[str, str]:
    env = dict(os.environ)
    env.update(sim.env())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def mpirun(
    sim: Sim, tmp_path: Path, path: str, action: str, **env: str
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    argv = [str(MPIRUN), "--oversubscribe", "-np", str(NP), "-x", f"SLURM_JOB_ID={JOB}"]
    if os.geteuid() == 0:
        argv.insert(1, "--allow-run-as-root")
    argv += [sys.executable, str(script), path, action, str(out)]
    argv.append(sim.client)
    proc = subprocess.Popen(
        argv,
        env={**_env(sim), **env},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"mpirun hung for {LIMIT} s; stderr: {stderr[-2000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def seen(tmp_path: Path) -> dict[int, dict[str, object]]:
    return {int(p.stem): json.loads(p.read_text()) for p in (tmp_path / "out").glob("*.json")}


def cli(sim: Sim, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "mpswrap", *args, "--run-dir", str(sim.admin_run), "--job", JOB]
    return subprocess.run(argv, env=_env(sim), text=True, capture_output=True, timeout=60)


def assert_placed(sim: Sim, ranks: dict[int, dict[str, object]], root: Path, mode: str) -> None:
    assert sorted(ranks) == list(range(NP))
    for rank, info in ranks.items():
        pos = rank // 2  # block placement: ranks 0,1 -> GPU 0; 2,3 -> GPU 1
        pipe = str(JobLayout(root, NODE, JOB).gpu(f"g{pos}").pipe)
        assert (info["local_rank"], info["local_size"]) == (rank, NP), info
        assert info["uuid"] == info["cvd"] == sim.uuids[pos], info
        assert info["pipe"] == info["env_pipe"] == pipe, info
        assert info["mode"] == mode, info
        assert info["client_rc"] == 0, info


@pytest.mark.parametrize("path", ["early", "comm"])
def test_ranks_get_their_gpu_and_user_daemons_leave_nothing(
    sim: Sim, tmp_path: Path, path: str
) -> None:
    res = mpirun(sim, tmp_path, path, "ok")
    assert res.returncode == 0, res.stderr
    assert_placed(sim, seen(tmp_path), sim.user_run, "user")
    assert not sim.wait_nothing_left(), "user-mode daemons outlived the job"
    assert not (sim.user_run / NODE / JOB).exists()


def test_prolog_daemons_are_used_and_left_alone(sim: Sim, tmp_path: Path) -> None:
    started = cli(sim, "start", "--gpus", "all")
    assert started.returncode == 0, started.stderr
    try:
        res = mpirun(sim, tmp_path, "early", "ok")
        assert res.returncode == 0, res.stderr
        assert_placed(sim, seen(tmp_path), sim.admin_run, "prolog")
        jobs = json.loads(cli(sim, "status", "--json").stdout)["jobs"]
        alive = [g["daemon"]["alive"] for j in jobs for g in j["gpus"]]
        assert alive == [True, True], "the session stopped daemons it did not start"
        assert not (sim.user_run / NODE / JOB).exists(), "started user daemons beside them"
    finally:
        stopped = cli(sim, "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not sim.wait_nothing_left()


@pytest.mark.parametrize("path", ["early", "comm"])
def test_exception_on_one_rank_aborts_the_job(sim: Sim, tmp_path: Path, path: str) -> None:
    res = mpirun(sim, tmp_path, path, "raise")
    assert res.returncode != 0
    assert "RuntimeError: boom on rank 1" in res.stderr, res.stderr
    assert "MPI_Abort(1)" in res.stderr, res.stderr
    assert not sim.wait_nothing_left(), "daemons outlived an aborted job"
    assert not (sim.user_run / NODE / JOB).exists()


def test_mpi_abort_inside_the_session_leaves_nothing(sim: Sim, tmp_path: Path) -> None:
    res = mpirun(sim, tmp_path, "early", "abort")
    assert res.returncode != 0
    # No rank released anything: the owner watchdog stops the daemons once all are gone.
    assert not sim.wait_nothing_left(), "daemons outlived MPI_Abort"
    assert not (sim.user_run / NODE / JOB).exists()


def test_node_leader_failure_fails_every_rank_without_hanging(sim: Sim, tmp_path: Path) -> None:
    missing = str(sim.root / "no-such-mps-control")
    res = mpirun(sim, tmp_path, "comm", "ok", MPSWRAP_CONTROL_BINARY=missing)
    assert res.returncode != 0
    assert "MPS control program not found" in res.stderr, res.stderr
    assert not seen(tmp_path), "a rank entered the session although its leader failed"
    assert not sim.wait_nothing_left()
