"""Issue-5 gpu tier: mpi4py + PyTorch ranks through mpswrap.session() on the real GPUs, each
rank on the GPU its local rank gives it, on every GPU of the machine (issue 43)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.placed import placed
from tests.tree import REPO

from .conftest import leftovers, machine_gpus

pytestmark = pytest.mark.gpu


#: What each rank of examples/mpi_torch.py prints once it trained.
RANK_LINE = re.compile(
    r"^rank (?P<rank>\d+)/(?P<size>\d+) local (?P<local>\d+)/(?P<local_size>\d+) "
    r"gpu (?P<gpu>\S+) \(.*?\) (?P<mode>\w+) daemon, attached to MPS server (?P<server>\d+):",
    re.M,
)


def run_session(tmp: Path, ranks: int = 8, policy: str | None = None) -> list[dict[str, str]]:
    """``mpirun -np RANKS`` of examples/mpi_torch.py, user mode (``policy``: the gpu_policy
    setting); each rank's line, parsed. Every rank attached (``check_attached()`` in each)."""
    env = dict(os.environ, MPSWRAP_USER_RUN_DIR=str(tmp / "run"))
    env.update({"MPSWRAP_GPU_POLICY": policy} if policy else {})
    res = subprocess.run(
        [
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            str(ranks),
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
    found = [m.groupdict() for m in RANK_LINE.finditer(res.stdout)]
    assert sorted(int(r["rank"]) for r in found) == list(range(ranks)), res.stdout
    sizes = {(int(r["size"]), int(r["local_size"]), r["mode"]) for r in found}
    assert sizes == {(ranks, ranks, "user")}, sizes
    return found


def assert_placed(found: list[dict[str, str]], policy: str) -> None:
    """Each rank on the GPU ``policy`` gives its local rank, among all of the machine's;
    the ranks of a GPU on that GPU's one MPS server, and each GPU's server its own (a daemon
    per GPU)."""
    want = placed(policy, len(found), machine_gpus())
    assert {int(r["local"]): r["gpu"] for r in found} == dict(enumerate(want)), found
    servers: dict[str, set[str]] = {}
    for rank in found:
        servers.setdefault(rank["gpu"], set()).add(rank["server"])
    assert set(servers) == set(want), servers
    assert all(len(pids) == 1 for pids in servers.values()), servers
    assert len(set.union(*servers.values())) == len(servers), servers


def test_mpirun_8_torch_ranks_attach_through_session(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    """On every GPU of the machine, by block (the default): one GPU takes all 8 ranks, two
    take 4 each, four take 2 each."""
    assert_placed(run_session(shared_tmp), "block")
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
