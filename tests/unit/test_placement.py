from __future__ import annotations

from pathlib import Path

import pytest

from mpswrap.errors import CapacityError, UsageError
from mpswrap.job.placement import (
    Slot,
    check_capacity,
    choose_gpu,
    place,
    plan_positions,
    provision_threads,
)
from mpswrap.mps.control import client_env
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
    check_capacity(["A"], 48, "block", {"A": 48})
    with pytest.raises(CapacityError, match=r"49 new \+ 0 running > limit 48"):
        check_capacity(["A"], 49, "block", {"A": 48})
    with pytest.raises(CapacityError, match=r"40 new \+ 10 running > limit 48"):
        check_capacity(["A"], 40, "block", {"A": 48}, {"A": 10})


def test_capacity_counts_running_clients_per_gpu_and_policy() -> None:
    # 4 ranks on 2 GPUs: 2 each; B already runs 2 of its limit of 3.
    check_capacity(["A", "B"], 4, "cyclic", {"A": 3, "B": 4}, {"B": 2})
    with pytest.raises(CapacityError, match=r"\(B\): 2 new \+ 2 running > limit 3"):
        check_capacity(["A", "B"], 4, "block", {"A": 3, "B": 3}, {"B": 2})
    check_capacity(["A", "B"], 4, "block", {"A": 3, "B": 3}, {"A": 1})


def _slots(n: int) -> list[Slot]:
    root = Path("/run/mpswrap/n1/7")
    return [
        Slot(GpuDirs(f"g{i}", root / f"g{i}"), f"GPU-{i}", frozenset({i}), 2**33) for i in range(n)
    ]


def test_place_gives_the_rank_its_gpu_and_client_environment() -> None:
    slots = _slots(2)
    found = place(slots, 3, 4, policy="block", threads="uniform", mem_limit="auto")
    assert (found.position, found.uuid, found.threads) == (1, "GPU-1", 50.0)
    assert found.env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mpswrap/n1/7/g1/pipe"
    assert found.env["CUDA_VISIBLE_DEVICES"] == "GPU-1"
    assert found.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert place(slots, 3, 4, policy="cyclic").position == 1
    assert place(slots, 2, 4, policy="cyclic").position == 0
    # affinity: the rank's CPUs are near GPU 1 only
    assert place(slots, 0, 4, policy="affinity", rank_cpus=frozenset({1})).position == 1


def test_a_memory_limit_above_the_gpus_memory_is_refused_in_one_line() -> None:
    """8 GiB GPUs: 8G limits nothing, but is what was asked; 9G and 9000M are typos."""
    slots = _slots(1)
    assert place(slots, 0, 1, mem_limit="8G").env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8G"
    for spec in ("9G", "9000M"):
        with pytest.raises(UsageError) as caught:
            place(slots, 0, 1, mem_limit=spec)
        assert caught.value.line() == (
            f"--mem-limit {spec} is more than the GPU's memory (GPU-0): 8192M in all"
        )
        assert caught.value.hint == "give at most 8192M, or auto"


def test_a_request_over_every_gpus_limit_is_refused_before_any_work_that_grows_with_it() -> None:
    """``run -n 100000000``: the refusal costs what ``run -n 97`` costs, not a placement per
    client (before: 60 s and 800 MB)."""
    from mpswrap.job.placement import check_total

    limits = {"GPU-a": 48, "GPU-b": 48}
    with pytest.raises(CapacityError) as caught:
        check_total(["GPU-a", "GPU-b"], 10**12, limits, {"GPU-a": 1})
    assert caught.value.line() == (
        "too many MPS clients for the GPUs (2 GPU(s)): 1000000000000 new > 95 they take together"
    )
    with pytest.raises(CapacityError) as one:
        check_total(["GPU-a"], 10**12, limits)
    assert "for one GPU (GPU-a): 1000000000000 new + 0 running > limit 48" in one.value.line()
    check_total(["GPU-a", "GPU-b"], 95, limits, {"GPU-a": 1})  # fits together: placement decides
