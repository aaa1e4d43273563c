"""Issue-43 gpu tier, phase ``multi``: mpswrap on a machine of several GPUs, each check made
against the machine's own GPUs (``conftest.machine_gpus``, nvidia-smi's list).

- ``mpswrap run -n 8`` by block, cyclic and affinity: each rank a client of the daemon of the
  GPU its policy gives it (``status --json``), and on that GPU (``nvidia-smi``);
- ``session()`` under ``mpirun -np 8``, cyclic: the ranks of each GPU on that GPU's server;
- a fatal fault on one GPU: that GPU's clients get the error, the other GPUs' clients run on
  to the end;
- a rank of two GPUs (``--gpus-per-rank 2``): a daemon over each pair, each rank's PyTorch on
  both of its GPUs, through MPS; a count that does not fit the GPUs is refused in one line;
- real Slurm, a node of every GPU (gres positions in the reverse of NVML's order): jobs of 2
  and 4 GPUs (those the machine has), each plain ``srun`` task a client of its GPU's daemon.

It needs two GPUs or more: run_gpu_tier.sh refuses the phase on one (every test here fails
there rather than skip), and the Slurm test runs for the GPU counts the machine has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mpswrap.jobenv import parse_int_list
from tests.placed import placed
from tests.procs import ended
from tests.waits import wait_until

from .conftest import compute_apps, gpu_inventory, leftovers, machine_gpus
from .test_gpu_faults import _client_env, _mpswrap
from .test_gpu_session import assert_placed, run_session
from .test_gpu_slurm import (
    _wait_job_gone,
    assert_job_left_nothing,
    nvml_minors,
    slurm_cluster,
    submit,
    wait_clients,
)

pytestmark = pytest.mark.gpu
CLIENT = os.environ.get("MPS_CONTRACT_CLIENT", "/opt/mpswrap-site/cuda_client")
RANKS = 8
#: The GPU counts of the Slurm jobs: those this machine has (none is skipped: a count the
#: machine lacks is not a test here).
JOB_GPUS = [n for n in (2, 4, 8) if n <= len(machine_gpus())]


@pytest.fixture(autouse=True)
def several_gpus() -> None:
    count = len(machine_gpus())
    if count < 2:
        pytest.fail(f"the multi phase needs 2 GPUs or more; this machine has {count}")


def _env(root: Path) -> dict[str, str]:
    """A run's environment: its user-mode daemons under ``root`` (the admin layout, where
    root's own daemons and records go, stays apart: ``status`` reads both)."""
    return dict(os.environ, MPSWRAP_USER_RUN_DIR=str(root / "run"))


def _status(env: dict[str, str], job: str | None = None) -> dict[str, Any]:
    """``mpswrap status --json`` of the job (this user's only one without ``job``); {} while
    there is none."""
    args = ["status", "--json", *(["--job", job] if job else [])]
    try:
        jobs = json.loads(_mpswrap(env, *args).stdout)["jobs"]
    except ValueError:
        return {}
    return jobs[0] if jobs else {}


def _clients(status: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Every client the job's daemons list, by PID, with the daemon's ``uuid`` and
    ``pipe_dir`` added."""
    return {
        c["pid"]: {**c, "uuid": g["uuid"], "pipe_dir": g["pipe_dir"]}
        for g in status.get("gpus", [])
        for s in g.get("servers", [])
        for c in s["clients"]
    }


def _on_gpus(pids: set[int]) -> dict[int, set[str]]:
    """nvidia-smi's GPUs of each of ``pids``, once it lists them all (MPS lists a client when
    it connects; NVML may list its process a moment later)."""
    return wait_until(
        lambda: apps if pids <= set(apps := compute_apps()) else None,
        60,
        f"nvidia-smi to list {sorted(pids)}",
    )


def _ranks_listed(env: dict[str, str], job: str, ranks: int) -> dict[int, dict[str, Any]] | None:
    """Each rank's client (by rank) once the job's daemons list all ``ranks``."""
    by_rank = {c["rank"]: c for c in _clients(_status(env, job)).values()}
    return by_rank if set(by_rank) == set(range(ranks)) else None


# --- mpswrap run -n 8 ------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["block", "cyclic", "affinity"])
def test_run_of_eight_ranks_puts_each_on_the_gpu_its_policy_says(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]], policy: str
) -> None:
    """Affinity: the run pinned to the CPUs near the last GPU (NVML), so that where the GPUs
    sit on different NUMA nodes only those near them take ranks; where every CPU is near
    every GPU (2x H100, 2026-11-27), they all do, in turn."""
    gpus = machine_gpus()
    near = [gpu.cpus for gpu in gpu_inventory().gpus]
    mine = frozenset(os.sched_getaffinity(0))
    cpus = (near[-1] & mine or mine) if policy == "affinity" else mine
    want = placed(policy, RANKS, gpus, gpu_cpus=near, rank_cpus=cpus)
    print(f"{policy}: ranks on {want} (CPUs {sorted(cpus)}; near each GPU {near})")
    env, job = _env(shared_tmp), f"place-{policy}"
    argv = ["taskset", "-c", ",".join(map(str, sorted(cpus))), sys.executable, "-m", "mpswrap"]
    argv += ["run", "-n", str(RANKS), "--policy", policy, "--job", job, "--"]
    proc = subprocess.Popen(
        [*argv, CLIENT, "--seconds", "20"],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    with ended(proc):
        by_rank = wait_until(
            lambda: _ranks_listed(env, job, RANKS), 120, f"{RANKS} ranks listed as clients"
        )
        apps = _on_gpus({c["pid"] for c in by_rank.values()})
        out, err = proc.communicate(timeout=120)
    print(out[-2000:], err[-3000:], json.dumps(by_rank, indent=1), apps, sep="\n")
    assert proc.returncode == 0, err[-3000:]
    assert {r: c["uuid"] for r, c in by_rank.items()} == dict(enumerate(want))
    assert {r: apps.get(c["pid"]) for r, c in by_rank.items()} == {
        r: {uuid} for r, uuid in enumerate(want)
    }, apps
    assert leftovers(shared_tmp, mps_baseline) == []


# --- session() under mpirun ------------------------------------------------------------------
def test_session_under_mpirun_places_ranks_across_the_gpus_cyclically(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    """The session phase runs block; here cyclic (the gpu_policy setting), every GPU."""
    assert_placed(run_session(shared_tmp, RANKS, policy="cyclic"), "cyclic")
    assert leftovers(shared_tmp, mps_baseline) == []


# --- a fault on one GPU ----------------------------------------------------------------------
def test_a_fault_on_one_gpu_leaves_the_other_gpus_clients_running(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    """A daemon per GPU (``mpswrap start``, every GPU), two clients on each; an illegal
    memory access on GPU 0: GPU 0's clients get CUDA error 700 and its fault shows in
    ``status``; the clients of every other GPU stay listed, see no fault, and finish."""
    gpus = machine_gpus()
    # As test_gpu_faults.py: root's daemons in run_dir, root's record beside them.
    env = dict(_env(shared_tmp), MPSWRAP_RUN_DIR=str(shared_tmp / "run"), SLURM_JOB_ID="fault43")
    started = _mpswrap(env, "start", "--json")
    assert started.returncode == 0, started.stderr
    manifests = json.loads(started.stdout)
    assert [m["gpu_uuid"] for m in manifests] == list(gpus)
    envs = {m["gpu_uuid"]: _client_env(env, m, shared_tmp / "run") for m in manifests}
    clients = {
        uuid: [_cuda_client(cenv, "--seconds", "25") for _ in range(2)]
        for uuid, cenv in envs.items()
    }
    try:
        wanted = {uuid: {c.pid for c in procs} for uuid, procs in clients.items()}
        wait_until(
            lambda: _listed_by_gpu(env) == wanted, 120, f"the clients to be listed: {wanted}"
        )
        for proc in (c for procs in clients.values() for c in procs):
            line = proc.stdout.readline() if proc.stdout else ""
            assert "started" in line, line  # in its kernel loop
        culprit = _cuda_client(envs[gpus[0]], "--seconds", "25", "--fault-after", "1")
        culprit_out = culprit.communicate(timeout=120)[0]
        hit = [c.communicate(timeout=120)[0] for c in clients[gpus[0]]]
        status = _status(env)
        running = {u: [c.poll() for c in clients[u]] for u in gpus[1:]}
        print(culprit_out, hit, running, json.dumps(status, indent=1), sep="\n")
        assert "CUDA error 700" in culprit_out
        assert all(
            c.returncode != 0 and "CUDA error 700" in o
            for c, o in zip(clients[gpus[0]], hit, strict=True)
        )
        assert running == {u: [None, None] for u in gpus[1:]}, "a fault on GPU 0 ended others"
        faults = {g["uuid"]: g["faults"] for g in status["gpus"]}
        assert faults[gpus[0]] and not any(faults[u] for u in gpus[1:]), faults
        assert {u: pids for u, pids in _listed_by_gpu(env).items() if u != gpus[0]} == {
            u: wanted[u] for u in gpus[1:]
        }
        for uuid in gpus[1:]:
            for proc in clients[uuid]:
                out = proc.communicate(timeout=120)[0]
                assert proc.returncode == 0 and "done" in out, out
    finally:
        for proc in (c for procs in clients.values() for c in procs):
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    stopped = _mpswrap(env, "stop")
    print(stopped.stdout)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert leftovers(shared_tmp, mps_baseline) == []


def _cuda_client(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [CLIENT, *args], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def _listed_by_gpu(env: dict[str, str]) -> dict[str, set[int]]:
    """The clients each GPU's daemon lists (by the daemon's GPU)."""
    found: dict[str, set[int]] = {}
    for pid, client in _clients(_status(env)).items():
        found.setdefault(client["uuid"], set()).add(pid)
    return found


# --- a rank of two GPUs ----------------------------------------------------------------------
#: A rank of --gpus-per-rank: a matmul on each GPU it sees, whether each runs through MPS
#: (the driver's word), its view written to OUT/<rank>.json; then it holds its GPUs until
#: the file GO exists (the test looks meanwhile).
PROBE = """
import json, os, sys, time
import torch
from mpswrap.mps.cuda import mps_client
out, go = sys.argv[1], sys.argv[2]
seen = {"pid": os.getpid(), "rank": int(os.environ["MPSWRAP_RANK"]),
        "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
        "devices": torch.cuda.device_count(), "mps": [], "matmul": [], "uuid": []}
for i in range(seen["devices"]):
    with torch.cuda.device(i):
        a = torch.ones(1024, 1024, device=f"cuda:{i}")
        seen["matmul"].append(float((a @ a)[0, 0].item()))
        torch.cuda.synchronize(i)
        seen["mps"].append(mps_client())
        seen["uuid"].append(str(getattr(torch.cuda.get_device_properties(i), "uuid", "")))
path = os.path.join(out, str(seen["rank"]) + ".json")
with open(path + ".tmp", "w") as f:
    json.dump(seen, f)
os.rename(path + ".tmp", path)
deadline = time.monotonic() + 120
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def test_a_rank_of_two_gpus_drives_both_through_one_daemon_per_pair(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    """``mpswrap run -n G --gpus-per-rank 2`` on the machine's G GPUs: the GPUs taken two at a
    time, a daemon over each pair (``g0``, ``g1``, ...; ``status`` names its GPUs by their
    UUIDs joined by commas), two ranks on each pair (block); each rank's
    ``CUDA_VISIBLE_DEVICES`` names its pair and its pipe directory is its pair's daemon's;
    PyTorch sees two devices and runs a matmul on each, both through MPS (the driver says
    so, in the rank); nvidia-smi lists a rank, if at all, on its pair's GPUs only."""
    gpus = machine_gpus()
    assert len(gpus) % 2 == 0, f"{len(gpus)} GPUs: pairs need an even number"
    pairs = [",".join(gpus[i : i + 2]) for i in range(0, len(gpus), 2)]
    ranks = len(gpus)
    want = placed("block", ranks, pairs)
    env, job = _env(shared_tmp), "pairs"
    views, go = shared_tmp / "views", shared_tmp / "go"
    views.mkdir()
    argv = [sys.executable, "-m", "mpswrap", "run", "-n", str(ranks), "--gpus-per-rank", "2"]
    argv += ["--job", job, "--", sys.executable, "-c", PROBE, str(views), str(go)]
    proc = subprocess.Popen(
        argv,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    with ended(proc):
        wait_until(
            lambda: len(list(views.glob("*.json"))) == ranks or proc.poll() is not None,
            180,
            f"{ranks} ranks on their GPUs",
        )
        status, apps = _status(env, job), compute_apps()
        go.touch()
        out, err = proc.communicate(timeout=120)
    seen = {int(p.stem): json.loads(p.read_text()) for p in views.glob("*.json")}
    print(out[-2000:], err[-3000:], json.dumps(status, indent=1), apps, seen, sep="\n")
    assert proc.returncode == 0, err[-3000:]
    daemons = {g["key"]: g for g in status["gpus"]}
    assert {k: g["uuid"] for k, g in daemons.items()} == {f"g{i}": p for i, p in enumerate(pairs)}
    listed = _clients(status)
    assert sorted(seen) == list(range(ranks)), seen
    for rank, view in seen.items():
        pair = want[rank]
        assert view["cvd"] == pair, view
        assert view["devices"] == 2 and view["matmul"] == [1024.0, 1024.0], view
        assert view["mps"] == [True, True], view  # both GPUs through MPS
        client = listed.get(view["pid"])
        assert client is not None and client["uuid"] == pair, (view, client)
        assert view["pipe"] == client["pipe_dir"], (view, client)
        # What nvidia-smi shows of a client of two GPUs is printed above; wherever it lists
        # a rank, it must list it on the rank's pair.
        assert apps.get(view["pid"], set()) <= set(pair.split(",")), (rank, apps)
    assert leftovers(shared_tmp, mps_baseline) == []


def _not_fitting() -> list[int]:
    """--gpus-per-rank counts the machine's GPUs cannot serve: more than it has, and (where
    there is one) the smallest that does not divide them."""
    count = len(machine_gpus())
    return [count + 1, *[k for k in range(2, count) if count % k][:1]]


@pytest.mark.parametrize("per_rank", _not_fitting())
def test_gpus_per_rank_that_does_not_fit_the_gpus_is_refused_in_one_line(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]], per_rank: int
) -> None:
    argv = ["run", "-n", "2", "--gpus-per-rank", str(per_rank), "--", "true"]
    res = _mpswrap(_env(shared_tmp), *argv)
    print(res.stdout, res.stderr)
    assert res.returncode == 2, res.stderr
    # One line saying why (and, as every message of mpswrap may, a hint line), nothing else.
    first, *rest = res.stderr.strip().splitlines()
    assert first.startswith("mpswrap: ") and "gpus-per-rank" in first, res.stderr
    assert "unrecognized arguments" not in first, "mpswrap does not know --gpus-per-rank"
    assert rest == [] or (len(rest) == 1 and rest[0].startswith("hint: ")), res.stderr
    assert not any((shared_tmp / "run").rglob("manifest.json")), "a daemon was started"
    assert leftovers(shared_tmp, mps_baseline) == []


# --- real Slurm: jobs of several GPUs ----------------------------------------------------------
@pytest.fixture(scope="module")
def whole_node(gpu_user: str) -> Iterator[dict[str, Any]]:
    """A Slurm node of every GPU of the machine, its gres positions in the reverse of NVML's
    order: a position read as an NVML index would start daemons on other GPUs than the
    job's."""
    minors = nvml_minors()[::-1]
    gpus, order = str(len(minors)), " ".join(map(str, minors))
    with slurm_cluster(GPUS_PER_NODE=gpus, GPU_MINORS=order) as cluster:
        yield {**cluster, "minors": minors}


@pytest.mark.parametrize("count", JOB_GPUS)
def test_a_job_of_several_gpus_gets_a_daemon_on_each_and_its_tasks_on_theirs(
    whole_node: dict[str, Any], gpu_user: str, mps_baseline: set[tuple[int, float]], count: int
) -> None:
    """``sbatch -n 8 --gres=gpu:N`` with a plain ``srun`` of the CUDA client: the prolog starts
    a daemon on each GPU Slurm gave the job (``SLURM_JOB_GPUS``, through gres.conf's devices)
    and on no other; the task prolog sends the tasks to them by block (8/N on each); each
    task is a client of its GPU's daemon and nvidia-smi lists it on that GPU; after the
    epilog nothing is left."""
    work = Path(whole_node["state"]) / "work"
    name = f"gres{count}"
    given = work / f"{name}.gpus"
    command = f'echo "$SLURM_JOB_GPUS" > {given}\nsrun {CLIENT} --seconds 20'
    header = f"-n {RANKS} --gres=gpu:{count} --comment=mps"
    job = submit(whole_node, gpu_user, name, header, command)
    status = wait_clients(job, whole_node["config"], RANKS)
    apps = _on_gpus(set(_clients(status)))
    print(json.dumps(status, indent=1), apps, sep="\n")
    by_minor = {gpu.minor: gpu.uuid for gpu in gpu_inventory().gpus}
    positions = parse_int_list(given.read_text().strip(), "SLURM_JOB_GPUS")
    job_gpus = [by_minor[whole_node["minors"][p]] for p in positions]
    print(f"job {job}: gres positions {positions}, GPUs {job_gpus}")
    assert sorted(g["uuid"] for g in status["gpus"]) == sorted(job_gpus), status["gpus"]
    by_rank = {c["rank"]: c for c in _clients(status).values()}
    want = placed("block", RANKS, job_gpus)
    assert {r: c["uuid"] for r, c in by_rank.items()} == dict(enumerate(want))
    assert {r: apps.get(c["pid"]) for r, c in by_rank.items()} == {
        r: {uuid} for r, uuid in enumerate(want)
    }, apps
    assert all(c["user"] == gpu_user for c in by_rank.values()), by_rank
    _wait_job_gone(whole_node, job)
    out = (work / f"{name}.out").read_text()
    print(out[-2000:])
    assert "CUDA error" not in out, out
    assert_job_left_nothing(whole_node, job, mps_baseline)
