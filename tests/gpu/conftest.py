"""gpu tier: real GPU, real MPS binaries. Run with tests/gpu/run_gpu_tier.sh on the GPU machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

GPU_USER = "mpsgpu"


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
    if subprocess.run(["id", GPU_USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", GPU_USER], check=True)
    return GPU_USER


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A world-traversable scratch dir the unprivileged user can use."""
    path = Path(
        subprocess.run(
            ["mktemp", "-d", "/tmp/mpswrap-gpu.XXXX"], check=True, text=True, capture_output=True
        ).stdout.strip()
    )
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_user(
    user: str, argv: list[str], env: dict[str, str], **kw: object
) -> subprocess.CompletedProcess[str]:
    """Run argv as ``user`` with exactly ``env`` (runuser keeps what env -i passes)."""
    full = ["runuser", "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()], *argv]
    return subprocess.run(full, text=True, capture_output=True, **kw)  # type: ignore[call-overload]


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/nvidia/bin:/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": os.environ.get("PYTHONPATH", str(Path(__file__).resolve().parents[2])),
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHON": sys.executable,
    }
    env.update(extra or {})
    return env
