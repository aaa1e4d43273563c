"""gpu tier: root trusts only root, on the real driver. The hooks run as slurmd runs them
(root, the job's variables), without a Slurm.

After the prolog, the admin file names an MPS control program that another user can change
(a copy in their directory). Root must not run it: the epilog sends no control command and
ends the job's real daemon, its server and a busy PyTorch client by signal. Nothing of the job
may be left, and the GPU must serve the next client."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.users import run_as, user_argv

from .conftest import base_env, gpu_processes, leftovers

pytestmark = pytest.mark.gpu
HERE = Path(__file__).resolve().parent
NVIDIA_BIN = "/usr/local/nvidia/bin"


def _hook(env: dict[str, str], hook: str) -> subprocess.CompletedProcess[str]:
    context = {"prolog": "prolog_slurmd", "epilog": "epilog_slurmd"}[hook]
    return subprocess.run(
        [sys.executable, "-m", "mpswrap", hook],
        text=True,
        capture_output=True,
        env=dict(env, SLURM_SCRIPT_CONTEXT=context),
        timeout=180,
    )


def _wait_for_line(path: Path, text: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = path.read_text() if path.exists() else ""
        if text in found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {path} after {timeout:g} s")


def test_a_changeable_control_program_is_not_run_and_the_epilog_ends_the_job_by_signal(
    gpu_user: str, shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    user = pwd.getpwnam(gpu_user)
    binary = shutil.which("nvidia-cuda-mps-control", path=f"{NVIDIA_BIN}:{os.environ['PATH']}")
    assert binary
    conf = shared_tmp / "mpswrap.conf"
    settings = f"run_dir = {shared_tmp / 'run'}\nprolog_mode = always\nsyslog = no\n"
    conf.write_text(settings)
    env = dict(
        os.environ,
        MPSWRAP_CONFIG=str(conf),
        SLURM_JOB_ID="tr28",
        SLURM_JOB_UID=str(user.pw_uid),
        SLURM_JOB_GID=str(user.pw_gid),
        SLURM_JOB_USER=gpu_user,
        SLURMD_NODENAME="node1",
        SLURM_JOB_GPUS="0",
        SLURM_CONF=str(shared_tmp / "slurm.conf"),
    )
    started = _hook(env, "prolog")
    assert started.returncode == 0, started.stderr
    gpu_dir = shared_tmp / "run" / "node1" / "tr28" / "g0"
    manifest = json.loads((gpu_dir / "manifest.json").read_text())
    out = shared_tmp / "client.out"
    client_env = base_env(
        {
            "CUDA_MPS_PIPE_DIRECTORY": str(gpu_dir / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(gpu_dir / "log"),
            "CUDA_VISIBLE_DEVICES": manifest["gpu_uuid"],
        }
    )
    argv = [sys.executable, str(HERE / "torch_client.py"), "--seconds", "120"]
    with out.open("w") as sink:
        client = subprocess.Popen(
            user_argv(gpu_user, argv, client_env), stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        _wait_for_line(out, "started")
        theirs = shared_tmp / "theirs"
        theirs.mkdir()
        os.chown(theirs, user.pw_uid, user.pw_gid)
        copy = Path(shutil.copy2(binary, theirs / "nvidia-cuda-mps-control"))
        conf.write_text(settings + f"control_binary = {copy}\n")
        took = time.monotonic()
        done = _hook(env, "epilog")
        took = time.monotonic() - took
        print(done.stderr, f"epilog took {took:.2f} s", sep="\n")
        assert done.returncode == 0, done.stderr
        assert "ending the daemon by signal" in done.stderr, done.stderr
        assert "MPS control program can be changed by a user other than root" in done.stderr
        client.wait(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    print(out.read_text()[-2000:])
    assert not leftovers(shared_tmp, mps_baseline), "the job's MPS processes outlived it"
    assert not gpu_dir.parent.exists()
    left = gpu_processes()
    assert not left, left
    after = run_as(gpu_user, [*argv[:2], "--seconds", "2"], base_env(), timeout=180)
    assert after.returncode == 0 and "done" in after.stdout, after.stdout + after.stderr


def _procs_cgroup(pid: int) -> str:
    text = Path(f"/proc/{pid}/cgroup").read_text()
    return next(line[3:] for line in text.splitlines() if line.startswith("0::"))


@pytest.mark.parametrize("cgroup", ["auto", "none"], ids=["cgroup", "record-only"])
def test_the_daemon_runs_in_roots_cgroup_and_a_tampered_one_is_ended_by_the_epilog(
    gpu_user: str, shared_tmp: Path, mps_baseline: set[tuple[int, float]], cgroup: str
) -> None:
    """The prolog starts the real daemon in a cgroup of root's, and the server it starts
    follows it there. The job's user then stops the daemon (it answers nothing), points the
    manifest at PID 1 and removes the pid file and the logs: the epilog, which takes the
    daemon from root's record and cgroup (or, without one, the record's PID and start time
    and the process tree), ends daemon and server within its deadline, and the GPU serves the
    next client. The server is stopped too, and the deadline short (8 s: the polite steps
    wait out every command's timeout): they leave the forced end its share of it."""
    user = pwd.getpwnam(gpu_user)
    conf = shared_tmp / "mpswrap.conf"
    conf.write_text(
        f"run_dir = {shared_tmp / 'run'}\nprolog_mode = always\nsyslog = no\n"
        f"prestart_server = yes\ncgroup_root = {cgroup}\nteardown_deadline = 8\n"
        "command_timeout = 3\nquit_timeout = 2\n"
    )
    env = dict(
        os.environ,
        MPSWRAP_CONFIG=str(conf),
        SLURM_JOB_ID="tr29",
        SLURM_JOB_UID=str(user.pw_uid),
        SLURM_JOB_GID=str(user.pw_gid),
        SLURM_JOB_USER=gpu_user,
        SLURMD_NODENAME="node1",
        SLURM_JOB_GPUS="0",
        SLURM_CONF=str(shared_tmp / "slurm.conf"),
    )
    started = _hook(env, "prolog")
    assert started.returncode == 0, started.stderr
    gpu_dir = shared_tmp / "run" / "node1" / "tr29" / "g0"
    manifest = json.loads((gpu_dir / "manifest.json").read_text())
    daemon, server = int(manifest["daemon_pid"]), int(manifest["servers"][0]["pid"])
    where = _procs_cgroup(daemon)
    print(f"daemon {daemon} in {where}, server {server} in {_procs_cgroup(server)}")
    if cgroup == "auto":
        assert where.startswith("/mpswrap/node1.tr29.") and where.endswith("/g0"), where
        assert _procs_cgroup(server) == where
    client_env = base_env(
        {
            "CUDA_MPS_PIPE_DIRECTORY": str(gpu_dir / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(gpu_dir / "log"),
            "CUDA_VISIBLE_DEVICES": manifest["gpu_uuid"],
        }
    )
    argv = [sys.executable, str(HERE / "torch_client.py"), "--seconds", "3"]
    ran = run_as(gpu_user, argv, client_env, timeout=180)
    assert ran.returncode == 0 and "done" in ran.stdout, ran.stdout + ran.stderr
    assert "NEW CLIENT" in (gpu_dir / "log" / "control.log").read_text()  # it was a client
    forged = dict(manifest, daemon_pid=1, servers=[])
    (shared_tmp / "forged.json").write_text(json.dumps(forged))
    (shared_tmp / "forged.json").chmod(0o644)
    tamper = (
        f"kill -STOP {daemon} {server} && "
        f"cat {shared_tmp}/forged.json > {gpu_dir}/manifest.json && "
        f"rm -f {gpu_dir}/pipe/nvidia-cuda-mps-control.pid {gpu_dir}/log/*"
    )
    done = run_as(gpu_user, ["sh", "-c", tamper], base_env())
    assert done.returncode == 0, done.stderr
    took = time.monotonic()
    ended = _hook(env, "epilog")
    took = time.monotonic() - took
    print(ended.stderr, f"epilog took {took:.2f} s", sep="\n")
    assert ended.returncode == 0, ended.stderr
    assert took < 8 + 10, ended.stderr
    assert not psutil.pid_exists(daemon) or psutil.Process(daemon).status() == "zombie"
    assert not leftovers(shared_tmp, mps_baseline), "the job's MPS processes outlived it"
    assert not gpu_dir.parent.exists()
    assert not gpu_processes(), gpu_processes()
    after = run_as(gpu_user, [*argv[:2], "--seconds", "2"], base_env(), timeout=180)
    assert after.returncode == 0 and "done" in after.stdout, after.stdout + after.stderr


def _job_env(conf: Path, user: pwd.struct_passwd, job: str, shared_tmp: Path) -> dict[str, str]:
    return dict(
        os.environ,
        MPSWRAP_CONFIG=str(conf),
        SLURM_JOB_ID=job,
        SLURM_JOB_UID=str(user.pw_uid),
        SLURM_JOB_GID=str(user.pw_gid),
        SLURM_JOB_USER=user.pw_name,
        SLURMD_NODENAME="node1",
        SLURM_JOB_GPUS="0",
        SLURM_CONF=str(shared_tmp / "slurm.conf"),
    )


def _torch_client(
    gpu_user: str, gpu_dir: Path, seconds: float, out: Path
) -> subprocess.Popen[bytes]:
    manifest = json.loads((gpu_dir / "manifest.json").read_text())
    env = base_env(
        {
            "CUDA_MPS_PIPE_DIRECTORY": str(gpu_dir / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(gpu_dir / "log"),
            "CUDA_VISIBLE_DEVICES": manifest["gpu_uuid"],
        }
    )
    argv = [sys.executable, str(HERE / "torch_client.py"), "--seconds", str(seconds)]
    with out.open("w") as sink:
        return subprocess.Popen(
            user_argv(gpu_user, argv, env), stdout=sink, stderr=subprocess.STDOUT
        )


def test_a_socket_swapped_for_a_link_to_another_jobs_daemon_carries_no_command_there(
    gpu_user: str, shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    """Two jobs of one user on the GPU, each with a busy PyTorch client. In job A the user
    replaces the control socket with a symbolic link to job B's. A's epilog sends its
    commands through the socket root pinned when A's daemon started, on the real control
    program: A's client is ended through ``terminate_client`` (not by signal), A's daemon is
    gone, and B's daemon and busy client run on."""
    user = pwd.getpwnam(gpu_user)
    conf = shared_tmp / "mpswrap.conf"
    conf.write_text(f"run_dir = {shared_tmp / 'run'}\nprolog_mode = always\nsyslog = no\n")
    env_a, env_b = (_job_env(conf, user, job, shared_tmp) for job in ("tra", "trb"))
    for env in (env_a, env_b):
        started = _hook(env, "prolog")
        assert started.returncode == 0, started.stderr
    dir_a, dir_b = (shared_tmp / "run" / "node1" / job / "g0" for job in ("tra", "trb"))
    out_a, out_b = shared_tmp / "a.out", shared_tmp / "b.out"
    client_a = _torch_client(gpu_user, dir_a, 120, out_a)
    client_b = _torch_client(gpu_user, dir_b, 40, out_b)
    try:
        _wait_for_line(out_a, "started")
        _wait_for_line(out_b, "started")
        swap = f"cd {dir_a}/pipe && mv control control.orig && ln -s {dir_b}/pipe/control control"
        done = run_as(gpu_user, ["sh", "-c", swap], base_env())
        assert done.returncode == 0, done.stderr
        ended = _hook(env_a, "epilog")
        print(ended.stderr)
        assert ended.returncode == 0, ended.stderr
        assert "terminated 1 client(s)" in ended.stderr, ended.stderr
        assert "by signal" not in ended.stderr, ended.stderr
        client_a.wait(timeout=60)
        assert client_b.poll() is None, out_b.read_text()
        assert not dir_a.parent.exists()
        assert client_b.wait(timeout=120) == 0, out_b.read_text()  # B ran to its end
        print(out_b.read_text()[-500:])
    finally:
        for client in (client_a, client_b):
            if client.poll() is None:
                client.kill()
                client.wait()
    ended = _hook(env_b, "epilog")
    assert ended.returncode == 0, ended.stderr
    assert not leftovers(shared_tmp, mps_baseline), "the jobs' MPS processes outlived them"
    assert not gpu_processes(), gpu_processes()
