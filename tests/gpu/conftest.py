"""gpu tier: real GPU, real MPS binaries. Run with tests/gpu/run_gpu_tier.sh on the GPU machine."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from mpswrap.mps.gpu import Inventory, load_inventory
from tests.tree import REPO
from tests.users import ensure_user

GPU_USER = "mpsgpu"
MPS_NAMES = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
#: User-mode daemons stop after their last owner exits, or by the owner watchdog ~2.5 s later.
SETTLE = 20.0


def _have_gpu() -> bool:
    return (
        shutil.which("nvidia-smi") is not None
        and shutil.which(
            "nvidia-cuda-mps-control", path="/usr/local/nvidia/bin:" + os.environ.get("PATH", "")
        )
        is not None
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not _have_gpu():
        skip = pytest.mark.skip(reason="no NVIDIA GPU / MPS binaries here")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_user() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root to create the unprivileged test user")
    return ensure_user(GPU_USER, home=True)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A world-traversable scratch dir the unprivileged user can use."""
    path = Path(
        subprocess.run(
            ["mktemp", "-d", "/tmp/mpswrap-gpu.XXXX"], check=True, text=True, capture_output=True
        ).stdout.strip()
    )
    path.chmod(0o1777)  # sticky, like /tmp: run_dir's ancestors must be safe
    yield path
    shutil.rmtree(path, ignore_errors=True)


@functools.cache
def machine_gpus() -> tuple[str, ...]:
    """The machine's GPUs (UUIDs) in NVML index order, as nvidia-smi lists them: what each
    GPU test asserts against (how many there are, which one a rank is on). Empty without
    nvidia-smi (the tests then skip, see above)."""
    if shutil.which("nvidia-smi") is None:
        return ()
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
        text=True,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    rows = sorted((int(i), u.strip()) for i, u in (ln.split(",") for ln in out.splitlines() if ln))
    return tuple(uuid for _, uuid in rows)


def gpu_inventory() -> Inventory:
    """mpswrap's inventory of the machine's GPUs, in NVML order (each one's local CPUs and
    device minor number), from NVML, or from ``MPSWRAP_GPU_INVENTORY``'s file where that
    is set, as mpswrap itself reads it."""
    return load_inventory(os.environ.get("MPSWRAP_GPU_INVENTORY", "nvml"))


def compute_apps() -> dict[int, set[str]]:
    """The GPUs (UUIDs) each compute process is on now, by PID, as nvidia-smi lists them: an
    MPS client under its own PID, on its GPU (and its server, on the same GPU)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
        text=True,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    found: dict[int, set[str]] = {}
    for line in out.splitlines():
        pid, _, uuid = line.partition(",")
        if pid.strip().isdigit():
            found.setdefault(int(pid), set()).add(uuid.strip())
    return found


def gpu_processes(timeout: float = SETTLE) -> list[str]:
    """The PIDs of the compute processes on the GPU, as nvidia-smi lists them, once it lists
    none or after ``timeout`` seconds: the driver lists a process that was just killed (an
    MPS server ended by a watchdog) until it has torn down its context."""
    deadline = time.monotonic() + timeout
    while True:
        found = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            text=True,
            capture_output=True,
        ).stdout.split()
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/nvidia/bin:/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO)),
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHON": sys.executable,
    }
    env.update(extra or {})
    return env


def _mps_now() -> dict[tuple[int, float], str]:
    found = {}
    for proc in psutil.process_iter(["name", "create_time"]):
        try:
            if proc.info["name"] in MPS_NAMES and proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.pid, proc.info["create_time"]] = f"{proc.pid} {proc.info['name']}"
        except psutil.Error:
            continue
    return found


def new_mps(before: set[tuple[int, float]], timeout: float = SETTLE) -> list[str]:
    """MPS daemons and servers started since ``before`` and still running after up to
    ``timeout`` seconds (so a daemon that stops a moment after its job is not a leftover)."""
    deadline = time.monotonic() + timeout
    while True:
        left = [name for key, name in _mps_now().items() if key not in before]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def mps_baseline() -> Iterator[set[tuple[int, float]]]:
    """The MPS processes that ran before the test. After it, any new one still running fails
    the test and is killed, so one failure does not spill into the tests after it."""
    before = set(_mps_now())
    yield before
    left = new_mps(before)
    for key in _mps_now():
        if key not in before:
            try:
                psutil.Process(key[0]).kill()
            except psutil.Error:
                pass
    assert not left, f"MPS processes left behind by this test (killed now): {left}"


def leftovers(root: Path, before: set[tuple[int, float]], timeout: float = SETTLE) -> list[str]:
    """New MPS processes and processes naming ``root`` (an owner watchdog finishing its stop)
    still running after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = new_mps(before, timeout=0) + _naming(root)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def _naming(root: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            named = str(root) in " ".join(proc.info["cmdline"] or ())
            if named and proc.pid != os.getpid() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid} {proc.info['name']}")
        except psutil.Error:
            continue
    return found
