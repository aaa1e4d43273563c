"""Seams between jobs, driven through ``python -m mpswrap`` against the MPS simulator.

- a run without Slurm or ``--job`` is job ``run-<pid>``, and ``status``/``stop`` without
  ``--job`` find it;
- the per-GPU client limit counts the clients already running on the GPU;
- a start refused by the socket-path length check creates nothing;
- a job directory that cannot be removed is reported by path and does not block the next start.

Every test fails if any daemon, server or client of its node survives it (``finish_sim_node``)
and reaps every process it starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.simenv import SimNode
from tests.users import ensure_test_user
from tests.waits import wait_until

pytestmark = pytest.mark.functional


def end_run(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGTERM to the run's process group and wait; SIGKILL if it does not end. Reaps it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        return proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return proc.communicate(timeout=30)


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def started(path: Path) -> int:
    return sum(1 for r in records(path) if r["event"] == "start")


def client(node: SimNode, rec: Path, seconds: float) -> str:
    """The simulated client as a shell word list, to ``exec`` from ``sh -c``."""
    return f'{node.client} --seconds {seconds} --record {rec} --tag "$MPSWRAP_RANK"'


def jobs_of(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The jobs of ``status --json``: ``{"jobs": [...]}``, or one job at the top level."""
    return list(status["jobs"]) if "jobs" in status else [status]


def client_pids(status: dict[str, Any]) -> list[int]:
    """Every client pid under the servers of any GPU of any job."""
    pids: list[int] = []

    def walk(item: Any) -> None:
        if isinstance(item, dict):
            for client in item.get("clients", []) or []:
                if isinstance(client, dict) and "pid" in client:
                    pids.append(int(client["pid"]))
            for value in item.values():
                if isinstance(value, (dict, list)):
                    walk(value)
        elif isinstance(item, list):
            for value in item:
                walk(value)

    for job in jobs_of(status):
        for gpu in job.get("gpus", []) or []:
            walk(gpu.get("servers", []))
    return sorted(set(pids))


def status_json(node: SimNode, *args: str, **env: str) -> dict[str, Any]:
    res = node.run("status", "--json", *args, **env)  # type: ignore[arg-type]
    data: dict[str, Any] = json.loads(res.stdout)
    # 0: all healthy; 3: e.g. a daemon still starting (no manifest yet); 4: no jobs.
    assert res.returncode == (4 if not data["jobs"] else res.returncode), res.stderr
    assert res.returncode in (0, 3, 4), res.stderr
    return data


# --- 1. job id and listing without Slurm or --job -----------------------------------------
def test_run_without_job_is_listed_and_stopped_as_run_pid(node: SimNode) -> None:
    rec = node.root / "rec.json"
    proc = node.start("run", "-n", "2", "--", "sh", "-c", f"exec {client(node, rec, 30)}")
    job = f"run-{proc.pid}"
    try:
        wait_until(lambda: started(rec) == 2, 30, "the run's clients did not start")

        res = node.run("status")
        assert res.returncode == 0, res.stderr
        assert f"job {job}" in res.stdout, res.stdout
        assert "running" in res.stdout, res.stdout

        listed = [j for j in jobs_of(status_json(node)) if j.get("job") == job]
        assert len(listed) == 1, f"job {job} not listed"
        alive = [g for g in listed[0].get("gpus", []) if (g.get("daemon") or {}).get("alive")]
        assert alive, f"no live daemon listed for {job}: {listed[0]}"

        res = node.run("stop")
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"job {job}" in res.stdout, res.stdout

        # Its clients ended through terminate_client: the run ends by itself.
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run of {job} did not end after mpswrap stop")
        assert f"job {job}" in err, err
        ends = [r["reason"] for r in records(rec) if r["event"] == "end"]
        assert ends == ["terminated"] * 2, ends
        assert not [j for j in jobs_of(status_json(node)) if j.get("job") == job]
    finally:
        end_run(proc)


# --- 2. the client limit counts running clients ------------------------------------------
def test_client_limit_counts_clients_already_running(one_gpu: SimNode) -> None:
    node = one_gpu
    rec = node.root / "rec.json"
    marker = node.root / "second-run-started"
    limit = {"MPSWRAP_CLIENT_LIMIT": "3"}
    first = node.start(
        "run",
        "-n",
        "2",
        "--job",
        "cap",
        "--gpus",
        "0",
        "--",
        "sh",
        "-c",
        f"exec {client(node, rec, 30)}",
        **limit,
    )
    try:
        wait_until(
            lambda: len(client_pids(status_json(node, "--job", "cap", **limit))) == 2,
            30,
            "the first run's 2 clients to be listed",
        )

        second = node.run(
            "run",
            "-n",
            "2",
            "--job",
            "cap",
            "--gpus",
            "0",
            "--",
            "sh",
            "-c",
            f"touch {marker}; exec {client(node, rec, 1)}",
            **limit,  # type: ignore[arg-type]
        )
        assert not marker.exists(), "a rank of the second run was started"
        assert second.returncode == 2, second.stderr  # a request over a limit
        assert "limit 3" in second.stderr, second.stderr
        assert "2 running" in second.stderr, second.stderr
    finally:
        end_run(first)
    assert first.returncode is not None, "the first run did not end"
    ends = [r["reason"] for r in records(rec) if r["event"] == "end"]
    assert ends == ["terminated"] * 2, ends


# --- 3. a start refused for its socket path length leaves nothing ------------------------
@pytest.mark.parametrize("as_user", [False, True], ids=["root", "user"])
def test_socket_path_too_long_creates_nothing(one_gpu: SimNode, as_user: bool) -> None:
    node = one_gpu
    if as_user and os.geteuid() != 0:
        pytest.skip("needs root to run as a second user")
    user = ensure_test_user() if as_user else None
    long_dir = node.root / ("d" * 90)  # <dir>/<node>/longp/g0/pipe/control_privileged > 107
    rec = node.root / "rec.json"
    for attempt in (1, 2):
        res = node.mpswrap(
            "run",
            "-n",
            "1",
            "--job",
            "longp",
            "--",
            "sh",
            "-c",
            f"exec {client(node, rec, 0.5)}",
            user=user,
            MPSWRAP_USER_RUN_DIR=str(long_dir),
        )
        assert res.returncode != 0, f"attempt {attempt}: {res.stdout}{res.stderr}"
        assert "too long" in res.stderr, f"attempt {attempt}: {res.stderr}"
        left = sorted(str(p) for p in long_dir.rglob("*")) if long_dir.exists() else []
        assert not long_dir.exists(), f"attempt {attempt} left {long_dir}: {left}"
    assert not rec.exists(), "a client was started"


# --- 4. an undeletable job directory ----------------------------------------------------
def test_undeletable_job_dir_is_reported_and_does_not_block_next_start(one_gpu: SimNode) -> None:
    node = one_gpu
    if os.geteuid() != 0:
        pytest.skip("needs root to run as a second user (root ignores permissions)")
    user = ensure_test_user()
    rec = node.root / "rec.json"
    job_dir_of = 'dirname "$(dirname "$CUDA_MPS_PIPE_DIRECTORY")"'
    script = (
        f'echo "JOBDIR=$({job_dir_of})"; chmod 500 "$({job_dir_of})"; exec {client(node, rec, 0.5)}'
    )
    job_dir: Path | None = None
    try:
        first = node.mpswrap(
            "run", "-n", "1", "--job", "undel", "--", "sh", "-c", script, user=user
        )
        found = [ln.split("JOBDIR=", 1)[1] for ln in first.stdout.splitlines() if "JOBDIR=" in ln]
        assert found, first.stdout + first.stderr
        job_dir = Path(found[0].strip())
        assert job_dir.name == "undel" and job_dir.parent.parent == node.user_run_dir, job_dir
        assert started(rec) == 1, first.stdout + first.stderr
        reported = [
            ln
            for ln in first.stderr.splitlines()
            if "left behind" in ln.lower() and str(job_dir) in ln
        ]
        assert reported, f"no 'left behind' line naming {job_dir}: {first.stderr}"

        second = node.mpswrap(
            "run",
            "-n",
            "1",
            "--job",
            "undel",
            "--",
            "sh",
            "-c",
            f"exec {client(node, rec, 0.5)}",
            user=user,
        )
        assert second.returncode == 0, second.stderr
        assert started(rec) == 2, second.stdout + second.stderr
        assert not job_dir.exists(), f"{job_dir} still exists after the next run"
    finally:
        for path in (job_dir, *node.user_run_dir.glob("*/undel")):
            if path is not None and path.exists():
                path.chmod(0o700)
