"""Shared fixtures: a clean environment for every test, and no process left behind; strict
skips (tests/strict_skips.py) when asked for."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

from tests import strict_skips
from tests.procs import described
from tests.simenv import SimNode, sim_node

#: Variables that would change behaviour when the tests run inside an allocation.
_JOB_VARS = re.compile(
    r"^(?!OMPI_MCA_plm_)(SLURM_|SLURMD_|OMPI_|PMI_|PMIX_|PALS_|MV2_|FLUX_|CUDA_|MPSWRAP_|"
    r"MPI_LOCAL|LOCAL_RANK|LOCAL_WORLD_SIZE|RANK$|WORLD_SIZE$)"
)


def pytest_configure(config: pytest.Config) -> None:
    strict_skips.pytest_configure(config)  # MPS_STRICT_SKIPS=1: an unexpected skip fails


@pytest.fixture(autouse=True)
def clean_job_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if _JOB_VARS.match(name):
            monkeypatch.delenv(name)


def _descendants() -> set[tuple[int, float]]:
    out = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.add((proc.pid, proc.create_time()))
        except psutil.Error:
            continue
    return out


@pytest.fixture(autouse=True)
def no_leftover_children() -> Iterator[None]:
    """Fail a test whose children outlive it (psutil's reap_children idea); kill them."""
    before = _descendants()
    yield
    # Give detached helpers (the user-mode watchdog) a moment to notice and exit.
    deadline = time.monotonic() + 3.0
    while _descendants() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    left = []
    for pid, start in _descendants() - before:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() != start or (what := described(proc)) is None:
                continue
            left.append(what)
            proc.kill()
            proc.wait(5)
        except psutil.Error:
            continue
    assert not left, f"test left processes behind: {left}"


# --- simulated nodes (functional and integration tests) --------------------------------------
@pytest.fixture
def node() -> Iterator[SimNode]:
    """Two simulated GPUs; the test fails if anything of the node survives it."""
    with sim_node(gpus=2) as sim:
        yield sim


@pytest.fixture
def one_gpu() -> Iterator[SimNode]:
    with sim_node(gpus=1) as sim:
        yield sim


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts itself (clients, decoys): killed and reaped at the end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()  # not communicate(): a grandchild may still hold the pipe
