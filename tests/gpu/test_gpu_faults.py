"""Issue-7 gpu tier: a real fatal fault under mpswrap, and two-user isolation on the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.users import ensure_user, run_as
from tests.waits import wait_until

from .conftest import base_env, leftovers

pytestmark = pytest.mark.gpu
CLIENT = os.environ.get("MPS_CONTRACT_CLIENT", "cuda_client")


def _mpswrap(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mpswrap", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
    )


def _client_env(env: dict[str, str], manifest: dict[str, object], run: Path) -> dict[str, str]:
    g = next(run.rglob(str(manifest["key"])))
    return dict(
        env,
        CUDA_MPS_PIPE_DIRECTORY=str(g / "pipe"),
        CUDA_MPS_LOG_DIRECTORY=str(g / "log"),
        CUDA_VISIBLE_DEVICES=str(manifest["gpu_uuid"]),
    )


def client_pids(env: dict[str, str]) -> set[int]:
    """What MPS lists as clients of the job's server (``mpswrap status``)."""
    gpu = json.loads(_mpswrap(env, "status", "--json").stdout)["jobs"][0]["gpus"][0]
    return {c["pid"] for s in gpu.get("servers", []) for c in s["clients"]}


def recovered(servers: list[dict[str, object]], server_pid: int) -> bool:
    """The server that handled the fault is listed again, alone and ACTIVE (on the H100 it
    stays, and returns to ACTIVE once its affected clients have exited)."""
    return [(s["pid"], s["status"]) for s in servers] == [(server_pid, "ACTIVE")]


def test_illegal_memory_access_is_reported_and_the_server_recovers(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    env = dict(
        os.environ,
        MPSWRAP_USER_RUN_DIR=str(shared_tmp / "run"),
        MPSWRAP_RUN_DIR=str(shared_tmp / "run"),  # root starts daemons in run_dir
        SLURM_JOB_ID="fault1",
    )
    started = _mpswrap(env, "start", "--gpus", "0", "--json")
    assert started.returncode == 0, started.stderr
    m = json.loads(started.stdout)[0]
    cenv = _client_env(env, m, shared_tmp / "run")
    bystanders = [
        subprocess.Popen(
            [CLIENT, "--seconds", "30"],
            env=cenv,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(3)
    ]
    # Each bystander is a client of the server, and in its kernel loop, before the fault.
    pids = {b.pid for b in bystanders}
    wait_until(lambda: pids <= client_pids(env), 120, f"clients {sorted(pids)} to be listed")
    for b in bystanders:
        line = b.stdout.readline() if b.stdout else ""
        assert "started" in line, line
    culprit = subprocess.Popen(
        [CLIENT, "--seconds", "30", "--fault-after", "1"],
        env=cenv,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    culprit_out = culprit.communicate(timeout=120)[0]
    outs = [b.communicate(timeout=120)[0] for b in bystanders]
    print(culprit_out, outs)
    assert culprit.returncode != 0 and "CUDA error 700" in culprit_out
    assert all(
        b.returncode != 0 and "CUDA error 700" in o for b, o in zip(bystanders, outs, strict=False)
    )
    status = json.loads(_mpswrap(env, "status", "--json").stdout)["jobs"][0]
    print(json.dumps(status, indent=1))
    faults = status["gpus"][0]["faults"]
    assert faults, status
    print((Path(status["gpus"][0]["log_dir"]) / "server.log").read_text()[-4000:])
    # MPS names the clients that met the error, not the one that caused it (on 2026-11-23 it
    # named a bystander): every client of the server must be named, the culprit included.
    named = set(faults[-1]["reported_by"]) | set(faults[-1]["affected"])
    assert {culprit.pid, *(b.pid for b in bystanders)} <= named, faults
    deadline = time.monotonic() + 60
    while True:  # the server recovers once every affected client has exited
        st = json.loads(_mpswrap(env, "status", "--json").stdout)["jobs"][0]["gpus"][0]
        if recovered(st["servers"], faults[-1]["server_pid"]):
            break
        assert time.monotonic() < deadline, st
        time.sleep(0.5)
    assert st["faults"][-1]["recovered"], st["faults"]
    after = subprocess.run(
        [CLIENT, "--seconds", "1"], env=cenv, text=True, capture_output=True, timeout=120
    )
    assert after.returncode == 0, after.stdout
    stopped = _mpswrap(env, "stop")
    print(stopped.stdout)
    assert stopped.returncode == 0
    assert leftovers(shared_tmp, mps_baseline) == []


def test_a_second_user_cannot_reach_the_first_users_daemon(
    gpu_user: str, shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    other = ensure_user("mpsgpu2")
    env = base_env({"MPSWRAP_USER_RUN_DIR": str(shared_tmp / "run"), "SLURM_JOB_ID": "iso"})
    started = run_as(
        gpu_user,
        [sys.executable, "-m", "mpswrap", "start", "--gpus", "0", "--json"],
        env,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr
    m = json.loads(started.stdout)[0]
    g = next((shared_tmp / "run").rglob(str(m["key"])))
    pipe_env = dict(
        env, CUDA_MPS_PIPE_DIRECTORY=str(g / "pipe"), CUDA_MPS_LOG_DIRECTORY=str(shared_tmp)
    )
    for command in ("get_server_list", "quit"):
        res = run_as(other, ["nvidia-cuda-mps-control", command], pipe_env, timeout=60)
        print(command, res.returncode, res.stdout, res.stderr)
        assert res.returncode != 0 or "Cannot" in res.stdout + res.stderr
    intruder = run_as(other, [CLIENT, "--seconds", "1"], pipe_env, timeout=120)
    print(intruder.stdout, intruder.stderr)
    assert intruder.returncode == 0  # ran, but without MPS: silently
    status = run_as(
        gpu_user, [sys.executable, "-m", "mpswrap", "status", "--json"], env, timeout=60
    )
    gpu = json.loads(status.stdout)["jobs"][0]["gpus"][0]
    assert gpu["daemon"]["alive"]
    assert all(not s["clients"] for s in gpu["servers"])
    stopped = run_as(gpu_user, [sys.executable, "-m", "mpswrap", "stop"], env, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert leftovers(shared_tmp, mps_baseline) == []
