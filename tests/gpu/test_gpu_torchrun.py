"""gpu tier: ``mpswrap torchrun`` with PyTorch's own torchrun on the real GPUs.

Two workers per GPU of the machine, each the small PyTorch client (``torch_client.py``):
every one is an MPS client of its GPU's daemon (the run's summary counts them attached), sees
one GPU (its own, as ``cuda``), and nothing of the run is left.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.users import run_as

from .conftest import base_env, gpu_processes, leftovers, machine_gpus

pytestmark = pytest.mark.gpu
HERE = Path(__file__).resolve().parent


def _torchrun(where: Path) -> str:
    """PyTorch's torchrun: the one on PATH, else its module run by this interpreter under
    the name ``torchrun`` (what mpswrap knows it by)."""
    found = shutil.which("torchrun")
    if found:
        return found
    wrapper = where / "torchrun"
    wrapper.write_text(f"#!{sys.executable}\nfrom torch.distributed.run import main\nmain()\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def test_torchrun_workers_are_each_an_mps_client_of_their_gpu(
    gpu_user: str, shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    nproc = 2 * len(machine_gpus())
    bindir = shared_tmp / "bin"
    bindir.mkdir()
    bindir.chmod(0o755)
    torchrun = _torchrun(bindir)
    env = base_env({"MPSWRAP_USER_RUN_DIR": str(shared_tmp / "run")})
    env["PATH"] = f"{os.path.dirname(torchrun)}:{env['PATH']}"
    argv = [sys.executable, "-m", "mpswrap", "torchrun", f"--nproc-per-node={nproc}"]
    argv += ["--standalone", str(HERE / "torch_client.py"), "--seconds", "4"]
    took = time.monotonic()
    res = run_as(gpu_user, argv, env, timeout=300)
    print(res.stdout[-3000:], res.stderr[-3000:], f"took {time.monotonic() - took:.1f} s")
    assert res.returncode == 0, res.stderr
    assert f"{nproc} ranks, {nproc} attached" in res.stderr, res.stderr
    assert res.stdout.count(" done") == nproc, res.stdout
    assert not leftovers(shared_tmp, mps_baseline), "the run's MPS processes outlived it"
    assert not gpu_processes(), gpu_processes()
