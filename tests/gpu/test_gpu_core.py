"""Issue-2 gpu tier: mpswrap start/status/stop as an unprivileged user on the real GPU."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.users import popen_as, run_as

from .conftest import base_env, gpu_processes, leftovers, machine_gpus

pytestmark = pytest.mark.gpu
HERE = Path(__file__).resolve().parent


def _mpswrap(user: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_as(user, [sys.executable, "-m", "mpswrap", *args], env, timeout=120)


def test_user_start_pinned_four_torch_clients_status_stop(gpu_user: str, shared_tmp: Path) -> None:
    env = base_env({"MPSWRAP_USER_RUN_DIR": str(shared_tmp / "run"), "SLURM_JOB_ID": "gpu1"})
    started = _mpswrap(gpu_user, ["start", "--gpus", "0", "--cpus", "2-3", "--json"], env)
    assert started.returncode == 0, started.stderr
    # One daemon, for NVML's GPU 0, however many GPUs the machine has.
    (manifest,) = json.loads(started.stdout)
    assert manifest["gpu_uuid"] == machine_gpus()[0], manifest
    daemon = psutil.Process(manifest["daemon_pid"])
    assert daemon.username() == gpu_user
    assert sorted(daemon.cpu_affinity()) == [2, 3]
    assert manifest["cpus"] == [2, 3]
    job = shared_tmp / "run" / os.uname().nodename.split(".")[0] / "gpu1"
    pipe, log = job / "g0" / "pipe", job / "g0" / "log"
    assert (job.stat().st_mode & 0o777) == 0o700 and job.stat().st_uid == daemon.uids().real

    client_env = dict(
        env,
        CUDA_MPS_PIPE_DIRECTORY=str(pipe),
        CUDA_MPS_LOG_DIRECTORY=str(log),
        CUDA_VISIBLE_DEVICES=manifest["gpu_uuid"],
    )
    client = [sys.executable, str(HERE / "torch_client.py"), "--seconds", "120"]
    clients = [popen_as(gpu_user, client, client_env) for _ in range(4)]
    try:
        deadline = time.monotonic() + 90
        while True:
            status = json.loads(_mpswrap(gpu_user, ["status", "--json"], env).stdout)
            servers = status["jobs"][0]["gpus"][0]["servers"]
            pids = {c["pid"] for s in servers for c in s["clients"]}
            if len(pids) == 4 or time.monotonic() > deadline:
                break
            time.sleep(1)
        print(json.dumps(status, indent=1))
        assert [g["uuid"] for g in status["jobs"][0]["gpus"]] == [manifest["gpu_uuid"]]
        assert len(servers) == 1 and len(pids) == 4
        server = psutil.Process(servers[0]["pid"])
        assert sorted(server.cpu_affinity()) == [2, 3]  # the server inherits the daemon's CPUs
        client_users = {psutil.Process(p).username() for p in pids}
        assert client_users == {gpu_user}
        smi = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"],
            text=True,
            capture_output=True,
        ).stdout
        print(smi)

        stopped = _mpswrap(gpu_user, ["stop"], env)
        print(stopped.stdout, stopped.stderr)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        # Every client is ended through terminate_client first. A PyTorch process may take
        # longer than terminate_timeout to exit after its sticky error (seen: 0-2 of 4); the
        # ladder then SIGKILLs it, which is safe once its contexts are terminated.
        assert "terminated 4 client(s)" in stopped.stdout
        assert "server.log: 4 client termination(s) succeeded, 0 fatal error(s)" in stopped.stdout
        outs = [c.communicate(timeout=60)[0] for c in clients]
        for c, out in zip(clients, outs, strict=False):
            print(f"client {c.pid} exit {c.returncode}: {out.strip()[-300:]}")
            # runuser reports a SIGKILLed child as 137
            assert c.returncode in (1, -9, 137), out
            assert c.returncode != 1 or "CUDA error" in out, out
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
                c.communicate()
    assert not job.exists(), "job directory left behind"
    assert not psutil.pid_exists(daemon.pid) or daemon.status() == psutil.STATUS_ZOMBIE
    assert not psutil.pid_exists(server.pid)
    left = gpu_processes()
    assert not left, left


def test_daemons_whose_job_directory_went_are_ended_by_the_watchdog(
    gpu_user: str, shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    """A tmp cleaner removes a user-mode job directory under the real daemon and server (no
    socket is left to quit them through); once the job's rank is gone, the owner watchdog ends
    them by identity, and nothing is left on the GPU."""
    env = base_env({"MPSWRAP_USER_RUN_DIR": str(shared_tmp / "run")})
    client = [sys.executable, str(HERE / "torch_client.py"), "--seconds", "120"]
    argv = [sys.executable, "-m", "mpswrap", "--job", "gone", "--grace", "1", "--", *client]
    lines: list[str] = []
    started = threading.Event()
    job = shared_tmp / "run" / os.uname().nodename.split(".")[0] / "gone"
    with popen_as(gpu_user, argv, env, new_session=True) as proc:

        def read() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                lines.append(line)
                if "torch-client" in line:
                    started.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert started.wait(120), "".join(lines)
            daemons = [
                json.loads(m.read_text())["daemon_pid"] for m in job.glob("g*/manifest.json")
            ]
            servers = [c.pid for d in daemons for c in psutil.Process(d).children()]
            print(f"daemons {daemons}, servers {servers}")
            assert daemons and servers
            shutil.rmtree(job)
            # Every process under runuser, as Slurm signals a step's: runuser itself, signalled,
            # would SIGKILL its child 2 s later, before the rank has said what it did.
            for child in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            reader.join(timeout=10)
    output = "".join(lines)
    print(output[-3000:])
    assert not leftovers(shared_tmp, mps_baseline), "the job's MPS processes outlived it"
    assert not job.exists(), "the rank's teardown made the job directory again"
    assert "teardown not run (job directory gone)" in output
    left = gpu_processes()
    assert not left, left


def test_a_client_a_rank_left_in_the_background_ends_with_it(
    gpu_user: str, shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    """The rank (a shell) starts a real PyTorch client in the background and exits once it is
    on the GPU. The client inherited the rank's shield (TERM ignored): mpswrap ends it with
    its rank, through terminate_client (the client reports the MPS error), and the run exits 0
    with nothing left, on the GPU or of MPS."""
    env = base_env({"MPSWRAP_USER_RUN_DIR": str(shared_tmp / "run")})
    out = shared_tmp / "client.out"
    script = (
        f"{sys.executable} {HERE / 'torch_client.py'} --seconds 120 >{out} 2>&1 & "
        f"until grep -q started {out}; do sleep 0.2; done"
    )
    argv = [
        sys.executable,
        "-m",
        "mpswrap",
        "run",
        "-n",
        "1",
        "--job",
        "bg",
        "--",
        "sh",
        "-c",
        script,
    ]
    res = run_as(gpu_user, argv, env, timeout=300)
    print(res.stdout[-2000:], res.stderr[-3000:])
    assert res.returncode == 0, res.stderr
    assert "left" in res.stderr and "running: ending them" in res.stderr, res.stderr
    assert "teardown clean" in res.stderr, res.stderr
    assert "CUDA error" in out.read_text(), out.read_text()  # terminate_client reached it
    assert not leftovers(shared_tmp, mps_baseline), "the rank's client outlived it"
    left = gpu_processes()
    assert not left, left
