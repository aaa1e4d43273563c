"""Issue-17 gpu tier: each client's GPU memory in ``status --json`` and ``metrics`` against what it
allocated and what nvidia-smi says; the job's record after the epilog; a fault in all three.
The hooks run as slurmd runs them (root, the job's variables), without a Slurm, for a job of
the unprivileged test user (a job of uid 0 gets no MPS), whose clients run as that user."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.users import run_as, spawn_as
from tests.waits import wait_until

from .conftest import base_env, leftovers

pytestmark = pytest.mark.gpu
CLIENT = os.environ.get("MPS_CONTRACT_CLIENT", "cuda_client")
MIB = 2**20
#: MiB each client holds beyond what every client has (its CUDA context under MPS, its small
#: buffer): the first holds nothing more and measures that.
SIZES = (0, 1024, 2048, 4096, 8192)


def _mpswrap(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mpswrap", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
    )


def _job(tmp: Path, job: str, user: str) -> tuple[dict[str, str], dict[str, str]]:
    """The job's daemon started by the prolog hook, as slurmd runs it (root, the job's
    variables, an admin file with log_archive); the environment for the hooks and for
    mpswrap's commands, and the one for its clients."""
    conf = tmp / "mpswrap.conf"
    conf.write_text(
        f"run_dir = {tmp / 'run'}\nprolog_mode = always\nsyslog = no\n"
        f"log_archive = {tmp / 'archive'}\nterminate_window = 10\n"
    )
    env = dict(
        os.environ,
        MPSWRAP_CONFIG=str(conf),
        SLURM_JOB_ID=job,
        SLURM_JOB_UID=str(pwd.getpwnam(user).pw_uid),
        SLURM_JOB_GID=str(pwd.getpwnam(user).pw_gid),
        SLURM_JOB_USER=user,
        SLURMD_NODENAME="node1",
        SLURM_JOB_GPUS="0",
        SLURM_CONF=str(tmp / "slurm.conf"),
    )
    started = _mpswrap(dict(env, SLURM_SCRIPT_CONTEXT="prolog_slurmd"), "prolog")
    assert started.returncode == 0, started.stderr
    g = tmp / "run" / "node1" / job / "g0"
    manifest = json.loads((g / "manifest.json").read_text())
    cenv = base_env(
        {
            "CUDA_MPS_PIPE_DIRECTORY": str(g / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(g / "log"),
            "CUDA_VISIBLE_DEVICES": str(manifest["gpu_uuid"]),
        }
    )
    return env, cenv


def _epilog(env: dict[str, str]) -> None:
    done = _mpswrap(dict(env, SLURM_SCRIPT_CONTEXT="epilog_slurmd"), "epilog")
    assert done.returncode == 0, done.stdout + done.stderr


def _clients(env: dict[str, str]) -> list[dict[str, Any]]:
    status = json.loads(_mpswrap(env, "status", "--json").stdout)
    gpu = status["jobs"][0]["gpus"][0]
    return [c for s in gpu.get("servers", []) for c in s["clients"]]


def _smi() -> dict[int, int]:
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {int(p): int(m) * MIB for p, m in (line.split(",") for line in out.strip().splitlines())}


def _held(
    env: dict[str, str], procs: list[subprocess.Popen[str]]
) -> tuple[dict[int, dict[str, Any]], dict[int, int]] | None:
    """Status's clients and nvidia-smi's memory by PID, once status lists every client with
    what it allocated (its memset done) and nvidia-smi agrees on each (the two are read a
    moment apart)."""
    clients, smi = {c["pid"]: c for c in _clients(env)}, _smi()
    held = [clients.get(p.pid, {}).get("gpu_memory_bytes") or 0 for p in procs]
    done = all(h > s * MIB for h, s in zip(held, SIZES, strict=True))
    near = all(
        abs(h - smi.get(p.pid, 0)) <= max(0.05 * h, 64 * MIB)
        for h, p in zip(held, procs, strict=True)
    )
    return (clients, smi) if done and near else None


def test_each_clients_memory_in_status_metrics_and_the_record(
    gpu_user: str, shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    env, cenv = _job(shared_tmp, "met17", gpu_user)
    procs = [
        spawn_as(
            gpu_user,
            [CLIENT, "--seconds", "120", "--alloc-mib", str(size)],
            **cenv,
            MPSWRAP_RANK=str(r),
        )
        for r, size in enumerate(SIZES)
    ]
    try:
        clients, smi = wait_until(
            lambda: _held(env, procs), 90, "status and nvidia-smi to show each client's memory"
        )
        metrics = {
            f.name: f for f in text_string_to_metric_families(_mpswrap(env, "metrics").stdout)
        }
        # Each rank's memory (a rank here is one client): labelled by rank, never by pid.
        in_metrics = {
            int(s.labels["rank"]): s.value
            for s in metrics["mpswrap_client_gpu_memory_bytes"].samples
        }
        assert all("pid" not in s.labels for f in metrics.values() for s in f.samples)
        base = clients[procs[0].pid]["gpu_memory_bytes"]  # a client's own share, seen by NVML
        print(f"every client's own memory (context, buffer): {base / MIB:.0f} MiB")
        print("rank  allocated MiB  status MiB  nvidia-smi MiB  metrics MiB")
        for rank, (proc, size) in enumerate(zip(procs, SIZES, strict=True)):
            got = clients[proc.pid]["gpu_memory_bytes"]
            print(
                f"{rank:4}  {size:13}  {got / MIB:10.0f}  {smi.get(proc.pid, 0) / MIB:14.0f}"
                f"  {in_metrics.get(rank, 0) / MIB:11.0f}"
            )
            assert clients[proc.pid]["rank"] == rank
            assert abs(got - smi[proc.pid]) <= max(0.05 * got, 64 * MIB)
            assert in_metrics[rank] == got
            # what it allocated, plus what every client has: within 5% or 64 MiB
            assert abs(got - base - size * MIB) <= max(0.05 * size * MIB, 64 * MIB), (rank, got)
        _epilog(env)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    report = json.loads(_mpswrap(env, "report", "met17", "--json").stdout)[0]
    print(json.dumps(report, indent=1)[:3000])
    assert sorted(report["ended_by_terminate_client"]) == sorted(p.pid for p in procs)
    assert report["clients_seen_count"] == len(SIZES) and report["leftovers"] == []
    assert leftovers(shared_tmp, mps_baseline) == []


def test_a_fault_shows_in_status_metrics_and_the_record(
    gpu_user: str, shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    env, cenv = _job(shared_tmp, "fault17", gpu_user)
    bystander = spawn_as(gpu_user, [CLIENT, "--seconds", "60"], **cenv)
    # The bystander is a client of the server, and in its kernel loop, before the fault.
    pid = bystander.pid
    wait_until(lambda: pid in {c["pid"] for c in _clients(env)}, 120, f"client {pid} listed")
    line = bystander.stdout.readline() if bystander.stdout else ""
    assert "started" in line, line
    culprit = run_as(gpu_user, [CLIENT, "--seconds", "60", "--fault-after", "1"], cenv)
    bystander.communicate(timeout=120)
    assert "CUDA error 700" in culprit.stdout, culprit.stdout
    status = json.loads(_mpswrap(env, "status", "--json").stdout)["jobs"][0]["gpus"][0]
    assert status["faults"], status
    families = {f.name: f for f in text_string_to_metric_families(_mpswrap(env, "metrics").stdout)}
    assert [s.value for s in families["mpswrap_faults"].samples] == [len(status["faults"])]
    _epilog(env)
    report = json.loads(_mpswrap(env, "report", "fault17", "--json").stdout)[0]
    print(json.dumps(report["faults"], indent=1))
    named = {pid for f in report["faults"] for pid in f["reported_by"] + f["affected"]}
    assert report["faults"] and {bystander.pid} <= named, report["faults"]
    assert leftovers(shared_tmp, mps_baseline) == []
