"""Issue-3 gpu tier: can prolog-started daemons serve a job under ``job_container/tmpfs``?

``job_container/tmpfs`` gives each job private ``/tmp`` and ``/dev/shm`` mounts in a mount
namespace made for the job (hence ``PrologFlags=Contain``). MPS clients and their server share
files in ``/dev/shm``, and mpswrap's prolog starts the daemon from slurmd, outside that
namespace. This test asserts that both tasks of such a job are clients of the prolog's
daemon, and that after the epilog nothing is left and no node is drained; it records the mount
namespaces of the tasks and of the daemon (slurm/README.md reports them from its output).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from .test_gpu_slurm import (
    HERE,
    _sh,
    _wait_job_gone,
    assert_job_left_nothing,
    client_pids,
    job_status,
    slurm_cluster,
    submit,
)

pytestmark = pytest.mark.gpu
JOB_CONTAINER_CONF = "AutoBasePath=true\nBasePath=/var/tmp/mpswrap-job-containers\n"


def _mount_ns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return "?"


def _tasks(user: str) -> list[psutil.Process]:
    return [
        p
        for p in psutil.process_iter(["username", "cmdline"])
        if p.info["username"] == user and "torch_client.py" in " ".join(p.info["cmdline"] or ())
    ]


def test_prolog_daemon_and_job_container_tmpfs(
    gpu_user: str, mps_baseline: set[tuple[int, float]]
) -> None:
    # Not under /tmp: the job sees a private /tmp, where the TaskProlog would not be found
    # (seen on 2026-11-23, "task_prolog can not be executed ... No such file or directory").
    with slurm_cluster(
        state_root="/var/tmp",
        PROLOG_FLAGS="Alloc,Contain",
        EXTRA_CONF="JobContainerType=job_container/tmpfs",
        JOB_CONTAINER_CONF=JOB_CONTAINER_CONF,
    ) as cluster:
        work = Path(cluster["state"]) / "work"
        run = f"srun {sys.executable} {HERE / 'torch_client.py'} --seconds 20"
        job = submit(cluster, gpu_user, "jc", "-n 2 --gres=gpu:1 --comment=mps", run)
        found: dict[str, Any] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = job_status(job, cluster["config"])
            tasks = _tasks(gpu_user)
            found = {
                "daemon": status["gpus"][0]["daemon"] if status.get("gpus") else None,
                "clients": sorted(client_pids(status)),
                "tasks": sorted(t.pid for t in tasks),
            }
            if len(found["clients"]) == 2:
                break
            time.sleep(1)
        daemon = found["daemon"]
        found["daemon_mnt_ns"] = _mount_ns(daemon["pid"]) if daemon else None
        found["task_mnt_ns"] = sorted({_mount_ns(p) for p in found["tasks"]})
        found["smi"] = _sh(["nvidia-smi"]).stdout
        _wait_job_gone(cluster, job)
        out = (work / "jc.out").read_text(errors="replace")
        found["job_out"] = out[-2000:]
        print("TMPFS-RESULT " + json.dumps({k: v for k, v in found.items() if k != "smi"}))
        print(found["smi"])
        print(f"attached {len(found['clients'])} of 2 tasks")
        assert found["tasks"], "the job's tasks never ran"
        # Both clients are torch_client.py tasks of the job (srun's argv names it too), and both
        # tasks ran to the end.
        clients: list[int] = found["clients"]
        assert len(clients) == 2 and set(clients) <= set(found["tasks"]), found
        assert all(f"torch-client {pid} done" in out for pid in clients), out
        assert_job_left_nothing(cluster, job, mps_baseline)
