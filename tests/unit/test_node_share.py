"""The job's share of a node as Slurm details it: per-GPU gres/mps percentages, Slurm's CPU
numbering mapped to the OS's, and when slurmctld is asked at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpswrap.entry.slurmjob import (
    NodeShare,
    gpu_percentages,
    holds_part_of_node,
    mps_shares,
    os_cpus,
)
from mpswrap.errors import ConfigError
from mpswrap.jobenv import JobEnv


@pytest.mark.parametrize(
    ("gres", "shares"),
    [
        ("mps:150(100/100,50/100)", {0: 100.0, 1: 50.0}),  # 24.11, two GPUs
        ("mps:50(50/100,0/100)", {0: 50.0}),  # 24.11, one of two GPUs
        ("gpu:2(IDX:0-1),mps:40(0/200,40/200)", {1: 20.0}),  # GPUs of 200 shares each
        ("mps:50(IDX:1)", {}),  # 22.05: a total only
        ("gpu:2(IDX:0-1)", {}),
        ("mps:50(50/0)", {}),  # nonsense: nothing, never a division by zero
        ("mps:50(x/100)", {}),
        ("", {}),
    ],
)
def test_per_gpu_shares_are_read_from_the_gres_detail(gres: str, shares: dict[int, float]) -> None:
    assert mps_shares(gres) == shares


def _env(percentage: str | None) -> JobEnv:
    return JobEnv({} if percentage is None else {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": percentage})


def test_each_gpu_gets_its_own_share_capped_at_100() -> None:
    share = NodeShare((0,), {0: 100.0, 1: 50.0})
    assert gpu_percentages(_env("150"), share, [0, 1]) == [100.0, 50.0]
    assert gpu_percentages(_env("150"), share, [1, 0]) == [50.0, 100.0]
    big = NodeShare((0,), {0: 0.05, 1: 250.0})  # floor 1, cap 100
    assert gpu_percentages(_env("250"), big, [0, 1]) == [1.0, 100.0]


def test_one_gpu_or_no_details_keep_slurms_one_value() -> None:
    assert gpu_percentages(_env("25"), None, [0]) == [25.0]
    assert gpu_percentages(_env("25"), NodeShare((0,), {}), [0, 1]) == [25.0, 25.0]
    assert gpu_percentages(_env(None), None, [0, 1]) == [None, None]
    # Above 100 without per-GPU details (22.05 with mps and shard: 625) is refused.
    with pytest.raises(ConfigError, match="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
        gpu_percentages(_env("625"), None, [0])
    # Details for other GPUs than the job's: Slurm's one value, which must then be a percentage.
    with pytest.raises(ConfigError):
        gpu_percentages(_env("150"), NodeShare((0,), {0: 100.0}), [0, 1])


def _sysfs(tmp_path: Path, layout: dict[int, tuple[int, int]]) -> str:
    """A fake /sys/devices/system/cpu: cpu -> (package, core)."""
    root = tmp_path / "cpu"
    for cpu, (package, core) in layout.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
    (root / "online").write_text(f"0-{max(layout)}\n")
    return str(root)


def test_slurms_cpu_ids_are_mapped_by_socket_core_thread(tmp_path: Path) -> None:
    # 2 sockets x 2 cores x 2 threads, the OS numbering threads last: cpu0-3 are the first
    # threads of the four cores, cpu4-7 their siblings.
    layout = {c: (c % 4 // 2, c % 2) for c in range(8)}
    sysfs = _sysfs(tmp_path, layout)
    # Slurm: 0,1 = socket 0 core 0 (cpu0, cpu4); 2,3 = socket 0 core 1 (cpu1, cpu5); ...
    assert os_cpus((0, 1), sysfs) == {0, 4}
    assert os_cpus((2, 3), sysfs) == {1, 5}
    assert os_cpus((4, 5, 6, 7), sysfs) == {2, 6, 3, 7}
    assert os_cpus((8, 9), sysfs) == frozenset()  # ids this machine has not


def test_slurmctld_is_asked_only_for_part_of_a_node(tmp_path: Path) -> None:
    sysfs = _sysfs(tmp_path, {c: (0, c) for c in range(16)})
    for text, asks in [("16", False), ("8", True), ("16(x2)", False), ("16,8", True), ("", False)]:
        env = JobEnv({"SLURM_JOB_CPUS_PER_NODE": text} if text else {})
        assert holds_part_of_node(env, sysfs) is asks, text
