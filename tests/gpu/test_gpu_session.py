"""Issue-5 gpu tier: mpi4py + PyTorch ranks through mpswrap.session() on the real GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tree import REPO

from .conftest import leftovers

pytestmark = pytest.mark.gpu


def test_mpirun_8_torch_ranks_attach_through_session(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    env = dict(os.environ, MPSWRAP_USER_RUN_DIR=str(shared_tmp / "run"))
    res = subprocess.run(
        [
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "8",
            sys.executable,
            str(REPO / "examples" / "mpi_torch.py"),
        ],
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
    )
    print(res.stdout, res.stderr[-3000:])
    assert res.returncode == 0
    lines = [ln for ln in res.stdout.splitlines() if "attached to MPS server" in ln]
    assert len(lines) == 8, res.stdout
    assert len({ln.split("attached to MPS server ")[1].split(":")[0] for ln in lines}) == 1
    assert leftovers(shared_tmp, mps_baseline) == []
    assert not any((shared_tmp / "run").rglob("manifest.json"))


def test_cuda_before_session_is_refused(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    code = (
        "import torch, mpswrap\ntorch.zeros(1, device='cuda')\nwith mpswrap.session():\n    pass\n"
    )
    env = dict(os.environ, MPSWRAP_USER_RUN_DIR=str(shared_tmp / "run"))
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, text=True, capture_output=True, timeout=120
    )
    print(res.stdout, res.stderr[-2000:])
    assert res.returncode != 0
    assert "CUDA is already initialised in this process" in res.stderr
    assert leftovers(shared_tmp, mps_baseline) == []
