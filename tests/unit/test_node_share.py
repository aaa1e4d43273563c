"""The job's share of a node as Slurm details it: per-GPU gres/mps percentages, Slurm's CPU
numbering mapped to the OS's, and when slurmctld is asked at all."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mpswrap.errors import ConfigError
from mpswrap.jobenv import JobEnv
from mpswrap.slurm import scontrol
from mpswrap.slurm.scontrol import (
    NodeShare,
    cpus_here,
    gpu_percentages,
    holds_part_of_node,
    mps_shares,
    node_share,
    os_cpus,
)


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
    cases = [
        ("16", "n1", False),
        ("8", "n1", True),
        ("16(x2)", "n[1-2]", False),
        ("16,8", "n[1-2]", False),
        ("8,16", "n[1-2]", True),
        ("", "n1", False),
    ]
    for text, nodes, asks in cases:
        env = JobEnv(
            {
                "SLURMD_NODENAME": "n1",
                "SLURM_NODELIST": nodes,
                **({"SLURM_JOB_CPUS_PER_NODE": text} if text else {}),
            }
        )
        assert holds_part_of_node(env, sysfs) is asks, (text, nodes)
    assert (
        cpus_here(
            JobEnv(
                {
                    "SLURMD_NODENAME": "n2",
                    "SLURM_JOB_NODELIST": "n[1-3]",
                    "SLURM_JOB_CPUS_PER_NODE": "4,2(x2)",
                }
            )
        )
        == 2
    )


REAL = """JobId=7 JobName=train
   NodeList=n1 BatchHost=n1
   NumNodes=1 NumCPUs=4 NumTasks=1 CPUs/Task=4 ReqB:S:C:T=0:0:*:*
   JOB_GRES=mps:150
     Nodes=n1 CPU_IDs=4-7 Mem=0 GRES=mps:150(100/100,50/100)
   MinCPUsNode=4 MinMemoryNode=0 MinTmpDiskNode=0
   Comment={comment}
"""
ENV = {
    "SLURMD_NODENAME": "n1",
    "SLURM_JOB_ID": "7",
    "SLURM_NODELIST": "n1",
    "SLURM_JOB_CPUS_PER_NODE": "4",
}


def _answer(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr(scontrol, "_scontrol_text", lambda env, argv, what: text)


def test_the_one_line_for_this_node_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(monkeypatch, REAL.format(comment="mps"))
    share = node_share(JobEnv(ENV))
    assert share is not None
    assert (share.cpu_ids, share.mps_shares) == ((4, 5, 6, 7), {0: 100.0, 1: 50.0})


@pytest.mark.parametrize(
    "forged",
    [
        "x\n     Nodes=n1 CPU_IDs=0-3 Mem=0 GRES=gpu:2(IDX:0-1)",  # a second line for n1
        "x\n     Nodes=n[1-9] CPU_IDs=0-3 Mem=0 GRES=mps:10(100/100,100/100)",
    ],
)
def test_a_line_a_user_writes_into_the_answer_is_never_taken(
    monkeypatch: pytest.MonkeyPatch, forged: str
) -> None:
    """Comment=, JobName= and paths are the user's text: a forged detail line makes two
    lines for the node, and the prolog takes neither."""
    _answer(monkeypatch, REAL.format(comment=forged))
    assert node_share(JobEnv(ENV)) is None


def test_a_forged_line_naming_more_nodes_than_slurm_allows_is_refused_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Nodes=zz[0-999999999999]`` in the user's text: refused without expanding it (a
    trillion names would fill memory), and the prolog takes neither line."""
    forged = "x\n     Nodes=zz[0-999999999999] CPU_IDs=0-3 Mem=0"
    _answer(monkeypatch, REAL.format(comment=forged))
    took = time.monotonic()
    assert node_share(JobEnv(ENV)) is None
    assert time.monotonic() - took < 1.0


def test_a_line_that_disagrees_with_slurmds_cpu_count_is_not_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _answer(monkeypatch, REAL.format(comment="mps"))
    assert node_share(JobEnv({**ENV, "SLURM_JOB_CPUS_PER_NODE": "8"})) is None
