from __future__ import annotations

from pathlib import Path

import pytest

from mpswrap.client import (
    check_capacity,
    choose_gpu,
    client_env,
    plan_positions,
    provision_threads,
)
from mpswrap.errors import CapacityError, UsageError
from mpswrap.paths import GpuDirs


def test_block_and_cyclic() -> None:
    assert plan_positions(6, 2, "block") == [0, 0, 0, 1, 1, 1]
    assert plan_positions(6, 2, "cyclic") == [0, 1, 0, 1, 0, 1]
    assert plan_positions(5, 2, "block") == [0, 0, 0, 1, 1]
    assert plan_positions(1, 4, "block") == [0]


def test_affinity_prefers_near_gpus() -> None:
    gpu_cpus = [frozenset({0, 1}), frozenset({2, 3})]
    assert choose_gpu(0, 2, 2, policy="affinity", rank_cpus=frozenset({3}), gpu_cpus=gpu_cpus) == 1
    # no overlap: falls back to block
    assert choose_gpu(1, 2, 2, policy="affinity", rank_cpus=frozenset({9}), gpu_cpus=gpu_cpus) == 1


def test_bad_rank_and_policy() -> None:
    with pytest.raises(UsageError):
        choose_gpu(4, 4, 2)
    with pytest.raises(UsageError):
        choose_gpu(0, 4, 2, policy="random")
    with pytest.raises(UsageError):
        choose_gpu(0, 4, 0)


def test_threads_provisioning() -> None:
    assert provision_threads(None, 4, 0) is None
    assert provision_threads("none", 4, 0) is None
    assert provision_threads("uniform", 4, 0) == 25.0
    assert provision_threads("oversubscribe", 4, 0) == 50.0
    assert provision_threads("oversubscribe", 1, 0) == 100.0
    assert provision_threads("30", 4, 0) == 30.0
    shares = [provision_threads("3:1", 4, i) for i in range(4)]
    assert shares == [37.5, 12.5, 37.5, 12.5]
    with pytest.raises(UsageError):
        provision_threads("0", 4, 0)
    with pytest.raises(UsageError):
        provision_threads("1:-1", 2, 0)
    with pytest.raises(UsageError):
        provision_threads("lots", 2, 0)


def test_client_env() -> None:
    dirs = GpuDirs("g0", Path("/run/mpswrap/n1/7/g0"))
    env = client_env(dirs, "GPU-1", threads=25.0, mem_limit="2G", priority=1)
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/mpswrap/n1/7/g0/pipe",
        "CUDA_MPS_LOG_DIRECTORY": "/run/mpswrap/n1/7/g0/log",
        "CUDA_VISIBLE_DEVICES": "GPU-1",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2G",
        "CUDA_MPS_CLIENT_PRIORITY": "1",
    }


def test_capacity() -> None:
    check_capacity({"A": 48}, {"A": 48})
    with pytest.raises(CapacityError, match=r"49 new \+ 0 running > limit 48"):
        check_capacity({"A": 49}, {"A": 48})
    with pytest.raises(CapacityError, match="running"):
        check_capacity({"A": 40}, {"A": 48}, {"A": 10})
