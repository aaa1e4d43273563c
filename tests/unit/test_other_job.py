"""Whose Slurm job a process is (``mps.identity.other_job``): Slurm's cgroups decide where one
names a job, in the cgroup2 tree or any v1 hierarchy; else, for root's teardown of a Slurm
job's daemon, the ``SLURM_JOB_ID`` slurmstepd gave the process."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from mpswrap import _proc
from mpswrap.mps import identity
from mpswrap.mps.identity import other_job

V1 = ["12:freezer:/slurm/uid_1005/job_999/step_0", "1:name=systemd:/system.slice/slurmd.service"]
V2 = ["0::/system.slice/slurmstepd.scope/job_101/step_0/user/task_0"]


@pytest.mark.parametrize(
    ("paths", "env", "by_env", "other"),
    [
        (V1, None, False, True),  # a v1 hierarchy names job 999: the hybrid layout's case
        (V2, None, False, False),
        (V2, "999", True, False),  # the cgroup outranks a variable its user may set
        (["0::/user.slice/user-1005.slice/session-3.scope"], "102", True, True),
        (["0::/user.slice/user-1005.slice/session-3.scope"], "102", False, False),
        (["0::/user.slice"], "101", True, False),
        (["0::/user.slice"], None, True, False),
        ([], None, True, False),  # gone
        (["0::/a/job_101", "3:cpu:/slurm/job_102"], None, False, True),
    ],
)
def test_a_process_is_another_jobs_by_its_cgroups_else_by_its_job_id(
    monkeypatch: pytest.MonkeyPatch, paths: list[str], env: str | None, by_env: bool, other: bool
) -> None:
    monkeypatch.setattr(identity, "paths_of", lambda pid: [p.split(":", 2)[2] for p in paths])
    monkeypatch.setattr(_proc, "env_value", lambda pid, name: env)
    assert other_job(4242, "101", by_env=by_env) is other


def test_a_variable_is_read_from_a_bounded_start_of_the_environment() -> None:
    """Its owner sets how long a process's environment is: only its first
    ``ENV_VALUE_LIMIT`` bytes are read, and the first of a name set twice is the value."""
    import subprocess

    big = "x" * (100 << 10)  # the kernel takes no single string past 128 KiB
    fill = [(f"BIG{i}", big) for i in range(_proc.ENV_VALUE_LIMIT // len(big) + 1)]
    env = [("SLURM_JOB_ID", "7"), *fill, ("LATE", "1")]
    proc = subprocess.Popen(
        ["/bin/sleep", "30"], env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        # Popen may return before the child has exec'd (vfork): until then /proc shows the
        # parent's command line and environment, or none; and for a moment after the exec
        # the environment is still unreadable. Wait for sleep's own, readable.
        _wait_for(lambda: _read(proc.pid, "cmdline") == b"/bin/sleep\x0030\x00")
        _wait_for(lambda: _read(proc.pid, "environ").startswith(b"SLURM_JOB_ID=7\x00"))
        assert _proc.env_value(proc.pid, "SLURM_JOB_ID") == "7"
        assert _proc.env_value(proc.pid, "LATE") is None  # past the bound
        assert _proc.env_value(proc.pid, "NOT_SET") is None
        assert _proc.env_value(proc.pid, "JOB_ID") is None  # a name, not a suffix
    finally:
        proc.kill()
        proc.wait()
    assert _proc.env_value(proc.pid, "SLURM_JOB_ID") is None  # gone


def _read(pid: int, name: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as handle:
            return handle.read(64)
    except OSError:
        return b""


def _wait_for(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)
