"""Issue-3 gpu tier: real Slurm (cgroup plugins) + real MPS + PyTorch on the GPU machine.

An admin-style install: Debian's Slurm packages (carried as .debs), mpswrap's hooks installed
with mpswrap/slurm/install.sh, ``proctrack/cgroup``, ``task/cgroup`` and ``ConstrainDevices=yes``.
An sbatch job of the unprivileged user runs 8 tasks on one GPU with a plain ``srun``; each
task must be an MPS client of the job user's daemon, and after the epilog nothing is left.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.tree import PACKAGE, REPO
from tests.users import run_as

from .conftest import gpu_inventory, gpu_processes, new_mps

pytestmark = pytest.mark.gpu
HERE = Path(__file__).resolve().parent
CGROUP_CONF = (
    "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\nConstrainDevices=yes\nConstrainCores=yes\n"
)


def _sh(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, text=True, capture_output=True, **kw)


def _install_slurm() -> None:
    """Slurm from the carried .debs where it is missing; then, wherever it came from, the
    cgroup v2 controllers and ``system.slice`` its cgroup/v2 plugin needs on a machine
    without systemd (both idempotent)."""
    if not shutil.which("slurmctld"):
        debs = sorted(str(p) for p in (REPO / ".debs").glob("*.deb"))
        if not debs:
            pytest.skip("Slurm is not installed and no .debs were carried")
        _sh(["dpkg", "-i", "--force-depends", *debs], check=True)
    for c in ("cpuset", "cpu", "memory"):
        Path("/sys/fs/cgroup/cgroup.subtree_control").write_text(f"+{c}")
    Path("/sys/fs/cgroup/system.slice").mkdir(exist_ok=True)
    for c in ("cpuset", "cpu", "memory"):
        Path("/sys/fs/cgroup/system.slice/cgroup.subtree_control").write_text(f"+{c}")


def _make_importable() -> None:
    """The shims run ``python -I``: put mpswrap in the interpreter's site-packages via .pth."""
    import site

    pth = Path(site.getsitepackages()[0]) / "mpswrap-src.pth"
    pth.write_text(str(PACKAGE.parent) + "\n")


@contextmanager
def slurm_cluster(
    state_root: str = "/tmp", *, opt_in: str = "comment:mps", spank: bool = False, **knobs: str
) -> Iterator[dict[str, str]]:
    """One-node Slurm on the real GPU with mpswrap's hooks installed (in ``state_root``, as
    is the cluster's state); ``opt_in`` of the admin file; ``spank``: the SPANK plugin built
    (``install.sh --spank``) and named in plugstack.conf; ``knobs`` go to up.sh."""
    _install_slurm()
    _make_importable()
    made = _sh(["mktemp", "-d", f"{state_root}/mpswrap-gslurm.XXXX"], check=True)
    state = Path(made.stdout.strip())
    state.chmod(0o755)
    (state / ".mpswrap-slurm-state").touch()
    conf = state / "mpswrap.conf"
    conf.write_text(
        f"run_dir = /run/mpswrap\nprolog_mode = opt-in\nopt_in = {opt_in}\n"
        f"prolog_failure = drain\nsyslog = no\nlog_archive = {state / 'mps-logs'}\n"
        f"control_binary = "
        f"{shutil.which('nvidia-cuda-mps-control', path='/usr/local/nvidia/bin')}\n"
    )
    conf.chmod(0o644)
    hooks = state / "hooks-installed"
    _sh(
        [
            "bash",
            str(PACKAGE / "slurm" / "install.sh"),
            "--python",
            sys.executable,
            "--config",
            str(conf),
            "--dest",
            str(hooks),
            *(["--spank"] if spank else []),
        ],
        check=True,
    )
    env = dict(
        os.environ,
        NODES="1",
        GPUS_PER_NODE="1",
        SHARING="none",
        INSTALL="0",
        CPUS_PER_NODE="16",
        PROCTRACK="proctrack/cgroup",
        TASK_PLUGIN="task/cgroup",
        CGROUP_CONF=CGROUP_CONF,
        PROLOG=str(hooks / "prolog"),
        EPILOG=str(hooks / "epilog"),
        TASK_PROLOG=str(hooks / "task_prolog"),
        PLUGSTACK=f"optional {hooks / 'mpswrap_spank.so'}\n" if spank else "",
    )
    env.update(knobs)
    # The node's fake GPU devices carry the real GPUs' minor numbers, so that a gres position
    # names a real GPU (the first GPUS_PER_NODE in NVML order, unless the caller says).
    count = int(env["GPUS_PER_NODE"])
    env.setdefault("GPU_MINORS", " ".join(str(m) for m in nvml_minors()[:count]))
    up = _sh(
        ["bash", str(REPO / "tests/integration/cluster/up.sh"), str(state)], env=env, timeout=120
    )
    print(up.stdout, up.stderr)
    assert up.returncode == 0, up.stderr
    try:
        yield {
            "state": str(state),
            "SLURM_CONF": str(state / "etc" / "slurm.conf"),
            "config": str(conf),
        }
    finally:
        _sh(["bash", str(REPO / "tests/integration/cluster/down.sh"), str(state)], timeout=120)


def nvml_minors() -> list[int]:
    """Each GPU's device minor number (``/dev/nvidiaN``), in NVML index order."""
    return [gpu.minor for gpu in gpu_inventory().gpus]


@pytest.fixture(scope="module")
def cluster(gpu_user: str) -> Iterator[dict[str, str]]:
    with slurm_cluster() as c:
        yield c


def _slurm_env(cluster: dict[str, str]) -> dict[str, str]:
    return {"SLURM_CONF": cluster["SLURM_CONF"], "PATH": "/usr/bin:/bin"}


def _as_user(
    user: str, cluster: dict[str, str], argv: list[str], cwd: str
) -> subprocess.CompletedProcess[str]:
    return run_as(user, argv, {**_slurm_env(cluster), "HOME": "/tmp"}, cwd=cwd)


def submit(cluster: dict[str, str], user: str, name: str, header: str, command: str) -> str:
    """sbatch ``#SBATCH header`` + ``command`` as ``user`` from the cluster's work dir (output
    in ``<name>.out`` there); the job id."""
    work = Path(cluster["state"]) / "work"
    work.mkdir(mode=0o777, exist_ok=True)
    work.chmod(0o777)
    script = work / f"{name}.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH {header} -o {name}.out\n{command}\n")
    script.chmod(0o755)
    sub = _as_user(user, cluster, ["sbatch", "--parsable", str(script)], str(work))
    assert sub.returncode == 0, sub.stderr
    return sub.stdout.strip().split(";")[0]


def assert_job_left_nothing(
    cluster: dict[str, str], job: str, baseline: set[tuple[int, float]]
) -> None:
    """After the epilog: no job directory, no MPS process or GPU process started since
    ``baseline``, no drained node."""
    assert not Path("/run/mpswrap/node1", job).exists()
    assert not new_mps(baseline)
    left = gpu_processes()
    assert not left, left
    drained = _sh(["sinfo", "-h", "-N", "-o", "%N %t %E"], env=_slurm_env(cluster)).stdout
    assert "drain" not in drained, drained


def job_status(job: str, config: str | None = None) -> dict[str, Any]:
    """``mpswrap status --json`` of a job on node1 ({} when it has no daemons yet)."""
    env = dict(os.environ, **({"MPSWRAP_CONFIG": config} if config else {}))
    argv = [sys.executable, "-m", "mpswrap", "status", "--json", "--run-dir", "/run/mpswrap"]
    res = _sh([*argv, "--node", "node1", "--job", job], env=env)
    jobs = json.loads(res.stdout)["jobs"] if res.returncode == 0 else []
    return jobs[0] if jobs else {}


def client_pids(status: dict[str, Any]) -> set[int]:
    return {c["pid"] for g in status.get("gpus", []) for s in g["servers"] for c in s["clients"]}


def wait_clients(job: str, config: str, count: int) -> dict[str, Any]:
    """The job's status once its daemons list ``count`` clients (within 120 s)."""
    deadline = time.monotonic() + 120
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = job_status(job, config)
        if len(client_pids(status)) == count:
            return status
        time.sleep(0.5)
    raise AssertionError(f"{count} clients did not attach: {json.dumps(status, indent=1)}")


def test_sbatch_eight_plain_srun_tasks_are_mps_clients(
    cluster: dict[str, str], gpu_user: str, mps_baseline: set[tuple[int, float]]
) -> None:
    work = Path(cluster["state"]) / "work"
    run = f"srun {sys.executable} {HERE / 'torch_client.py'} --seconds 30"
    job = submit(cluster, gpu_user, "job", "-n 8 --gres=gpu:1 --comment=mps", run)
    status: dict[str, Any] = {}
    deadline = time.monotonic() + 120
    clients: set[int] = set()
    while time.monotonic() < deadline:
        status = job_status(job, cluster["config"])
        clients = client_pids(status)
        if len(clients) == 8:
            break
        time.sleep(1)
    smi = _sh(["nvidia-smi"]).stdout
    print(json.dumps(status, indent=1))
    print(smi)
    assert len(clients) == 8, status
    assert smi.count(" M+C ") >= 8, smi
    daemon = status["gpus"][0]["daemon"]
    assert psutil.Process(daemon["pid"]).username() == gpu_user
    for pid in clients:
        assert psutil.Process(pid).username() == gpu_user
    _wait_job_gone(cluster, job)
    print((work / "job.out").read_text()[-2000:])
    assert_job_left_nothing(cluster, job, mps_baseline)
    # The epilog's record of the job (log_archive): the 8 clients, the job's user, nothing left.
    env = dict(os.environ, MPSWRAP_CONFIG=cluster["config"])
    report = _sh([sys.executable, "-m", "mpswrap", "report", job, "--json"], env=env)
    records = json.loads(report.stdout)
    print(json.dumps(records, indent=1)[:2000])
    assert [(r["clients_seen_count"], r["user"], r["leftovers"]) for r in records] == [
        (8, gpu_user, [])
    ], records
    assert set(records[0]["clients_seen"]) == clients


def _wait_job_gone(cluster: dict[str, str], job: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = _sh(["squeue", "-h", "-j", job, "-o", "%T"], env=_slurm_env(cluster)).stdout
        if not out.strip():
            state = _sh(["scontrol", "show", "job", job], env=_slurm_env(cluster)).stdout
            if "COMPLETING" not in state:
                return
        time.sleep(0.5)
    raise AssertionError(f"job {job} did not finish")


def test_scancel_mid_kernel_under_srun_mpswrap(
    cluster: dict[str, str], gpu_user: str, mps_baseline: set[tuple[int, float]]
) -> None:
    """scancel while 4 ranks compute: each supervisor ends its client through
    terminate_client before any kill; the epilog finds nothing; the next job runs normally."""
    work = Path(cluster["state"]) / "work"
    run = f"srun {sys.executable} -m mpswrap {sys.executable} {HERE / 'torch_client.py'}"
    job = submit(
        cluster, gpu_user, "long", "-n 4 --gres=gpu:1 --comment=mps", run + " --seconds 600"
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if len(client_pids(job_status(job))) == 4:
            break
        time.sleep(1)
    else:
        raise AssertionError("4 clients did not attach")
    time.sleep(3)  # mid-kernel
    _as_user(gpu_user, cluster, ["scancel", job], str(work))
    _wait_job_gone(cluster, job)
    print((work / "long.out").read_text()[-3000:])
    logs = "".join(
        p.read_text()
        for p in (Path(cluster["state"]) / "mps-logs").glob(f"node1-{job}-*-server.log")
    )
    print(logs[-3000:])
    control = "".join(
        p.read_text()
        for p in (Path(cluster["state"]) / "mps-logs").glob(f"node1-{job}-*-control.log")
    )
    print(control[-4000:])
    assert logs.count("Client termination succeeded") == 4
    assert "fatal" not in logs.lower()
    assert_job_left_nothing(cluster, job, mps_baseline)
    # the GPU is usable by the next job
    nxt = _as_user(
        gpu_user,
        cluster,
        [
            "srun",
            "-n1",
            "--gres=gpu:1",
            "--comment=mps",
            sys.executable,
            str(HERE / "torch_client.py"),
            "--seconds",
            "2",
        ],
        str(work),
    )
    assert nxt.returncode == 0 and "done" in nxt.stdout, nxt.stdout + nxt.stderr


def test_farm_in_a_job_and_farm_status_from_the_login_shell(
    cluster: dict[str, str], gpu_user: str, mps_baseline: set[tuple[int, float]]
) -> None:
    """An sbatch job runs ``mpswrap farm`` of 8 PyTorch tasks, 4 at a time, on the prolog's
    daemon; the job's user asks ``mpswrap farm status --json`` from outside the job while it
    runs: the running tasks and their GPU; afterwards all 8 done, nothing left."""
    work = Path(cluster["state"]) / "work"
    tasks = work / "farm-tasks.txt"
    tasks.write_text(f"{sys.executable} {HERE / 'torch_client.py'} --seconds 8\n" * 8)
    tasks.chmod(0o644)
    farm_dir = work / "farm-dir"
    run = f"{sys.executable} -m mpswrap farm --per-gpu 4 --dir {farm_dir} {tasks}"
    job = submit(cluster, gpu_user, "farm", "-n 1 -c 8 --gres=gpu:1 --comment=mps", run)
    argv = [sys.executable, "-m", "mpswrap", "farm", "status", "--json", str(farm_dir)]
    status: dict[str, Any] = {}
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        res = _as_user(gpu_user, cluster, argv, str(work))
        if res.returncode == 0:
            status = json.loads(res.stdout)
            if status["running"] == 4:
                break
        time.sleep(0.5)
    print(json.dumps(status, indent=1))
    assert status.get("running") == 4, status
    (share,) = status["shares"]
    assert all(t["gpu"] for t in share["running_tasks"]), share
    _wait_job_gone(cluster, job)
    print((work / "farm.out").read_text()[-2000:])
    after = json.loads(_as_user(gpu_user, cluster, argv, str(work)).stdout)
    print(json.dumps(after, indent=1))
    assert (after["done"], after["failed"], after["running"]) == (8, 0, 0), after
    assert_job_left_nothing(cluster, job, mps_baseline)
