"""``mpswrap farm --per-gpu auto`` on the simulator: GPU memory learned through simulated NVML,
admission, the ``oom`` record and its retry, K in the journal, ``farm status`` and the summary;
the simulated GPU's memory itself (``mpswrap.sim.memory``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mpswrap.mps.gpu import usage
from mpswrap.sim.inventory import MEMORY_TOTAL, gpu_uuid
from tests.procs import ended
from tests.simenv import SimNode
from tests.waits import wait_until

pytestmark = pytest.mark.functional

#: Two of these do not fit on the simulated 80 GiB GPU; one does.
HEAVY_MIB = 45000


def _attempts(farm_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in (farm_dir / "state.jsonl").read_text().splitlines()]
    return [x for x in lines if "event" not in x]


def _heavy_tasks(node: SimNode, count: int, seconds: float) -> Path:
    tasks = node.root / "heavy.txt"
    line = f"{node.client} --seconds {seconds} --alloc-mib {HEAVY_MIB}"
    tasks.write_text("\n".join([line] * count) + "\n")
    return tasks


def _holding(node: SimNode, mib: int, seconds: float) -> subprocess.Popen[str]:
    """A simulated client on GPU 0 that holds ``mib`` MiB, returned once it has started."""
    proc = subprocess.Popen(
        [node.client, "--seconds", str(seconds), "--alloc-mib", str(mib)],
        env=node.env(CUDA_VISIBLE_DEVICES=gpu_uuid(0)),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        assert "started" in proc.stdout.readline()
    except BaseException:
        proc.kill()
        proc.communicate(timeout=30)
        raise
    return proc


def test_sim_clients_hold_memory_nvml_sees_it_and_the_one_that_crosses_gets_cuda_oom(
    one_gpu: SimNode,
) -> None:
    uuid = gpu_uuid(0)
    env = one_gpu.env(CUDA_VISIBLE_DEVICES=uuid)
    first = _holding(one_gpu, HEAVY_MIB, 30)
    try:
        seen = usage(uuid, str(one_gpu.inventory))
        assert seen is not None
        assert seen["memory_total_bytes"] == MEMORY_TOTAL
        assert seen["processes"] == {first.pid: HEAVY_MIB << 20}
        assert seen["memory_used_bytes"] == HEAVY_MIB << 20
        second = subprocess.run(
            [one_gpu.client, "--seconds", "1", "--alloc-mib", str(HEAVY_MIB)],
            env=env,
            text=True,
            capture_output=True,
            timeout=30,
        )
        assert second.returncode == 1
        assert "CUDA error 2: out of memory" in second.stderr
    finally:
        first.kill()
        first.communicate(timeout=30)
    gone = usage(uuid, str(one_gpu.inventory))
    assert gone is not None and gone["memory_used_bytes"] == 0, "a dead client holds nothing"


def test_auto_admits_by_learned_memory_where_a_fixed_k_runs_out(one_gpu: SimNode) -> None:
    tasks = _heavy_tasks(one_gpu, 3, 4.0)
    fixed = one_gpu.run(
        "farm", "--per-gpu", "2", "--progress", "lines", "--dir", "fixed", str(tasks), timeout=120
    )
    assert fixed.returncode == 1, fixed.stderr
    ooms = [a for a in _attempts(one_gpu.root / "fixed") if a["status"] == "oom"]
    assert ooms, "two heavy tasks at once: one ran out of memory"
    assert "ran out of GPU memory" in fixed.stderr
    assert any(not a["retried"] for a in ooms), fixed.stdout  # out of tries: oom, not failed
    assert all(a["status"] != "failed" for a in _attempts(one_gpu.root / "fixed"))

    auto = one_gpu.run("farm", "--progress", "lines", "--dir", "auto", str(tasks), timeout=120)
    assert auto.returncode == 0, auto.stderr
    attempts = _attempts(one_gpu.root / "auto")
    assert [a["status"] for a in attempts] == ["done"] * 3, attempts
    assert "GPU 0: K 2 -> 1 (its free GPU memory takes no more)" in auto.stderr
    assert "2 -> 1 (memory)" in auto.stdout  # the summary's row of the GPU
    status = one_gpu.run("farm", "status", "--json", "auto")
    data = json.loads(status.stdout)
    assert (data["done"], data["failed"], data["oom"]) == (3, 0, 0)
    packing = data["packing"][gpu_uuid(0)]
    assert packing["k"] == 1
    assert [(c["k"], c["why"]) for c in packing["history"]] == [(2, "start"), (1, "memory")]
    text = one_gpu.run("farm", "status", "auto").stdout
    assert "K on gpu 0: 2 -> 1 (memory)" in text
    fixed_status = json.loads(one_gpu.run("farm", "status", "--json", "fixed").stdout)
    assert fixed_status["oom"] >= 1
    assert [c["why"] for c in fixed_status["packing"][gpu_uuid(0)]["history"]] == ["start"]


def test_an_oom_on_a_full_gpu_is_retried_and_lowers_k(one_gpu: SimNode) -> None:
    """Memory the farm cannot see coming (a process outside it fills the GPU): the task that
    runs out is recorded ``oom``, put back, and runs once memory frees; K comes down. The hog
    holds its memory until the farm has recorded the ``oom`` (a hog on a timer could let go
    before a slow machine started the task)."""
    uuid = gpu_uuid(0)
    tasks = one_gpu.root / "t.txt"
    tasks.write_text(f"{one_gpu.client} --seconds 0.2 --alloc-mib 20000\n")
    hog = _holding(one_gpu, 76000, 600)
    try:
        farm = one_gpu.start("farm", "--progress", "lines", "--dir", "oom", str(tasks))
        with ended(farm):
            wait_until(lambda: _recorded(one_gpu.root / "oom", "oom"), 60, "an oom attempt")
            hog.kill()
            out, err = farm.communicate(timeout=120)
    finally:
        hog.kill()
        hog.communicate(timeout=30)
    attempts = _attempts(one_gpu.root / "oom")
    assert attempts[0]["status"] == "oom" and attempts[0]["retried"], attempts
    assert "(a task ran out of GPU memory)" in err
    history = json.loads(one_gpu.run("farm", "status", "--json", "oom").stdout)["packing"]
    assert ("oom", 1) in [(c["why"], c["k"]) for c in history[uuid]["history"]]
    # Three tries at most. The farm may try again before the hog is gone (with nothing
    # running, a GPU always takes a task): the task ends done or, out of tries, oom.
    assert len(attempts) <= 3
    assert {a["status"] for a in attempts} <= {"oom", "done"}
    assert farm.returncode == (0 if attempts[-1]["status"] == "done" else 1), out


def _recorded(farm_dir: Path, status: str) -> bool:
    """Whether the farm's state holds an attempt of that status (a line being written is
    not recorded yet)."""
    try:
        return any(a["status"] == status for a in _attempts(farm_dir))
    except (FileNotFoundError, json.JSONDecodeError):
        return False


def test_only_a_farm_with_enough_tasks_left_tries_fewer(one_gpu: SimNode) -> None:
    """K starts at the cap (2 here). After the first window (4 finishes) a farm of 6 tasks has
    none waiting and holds; one of 16 has 10 waiting, at least 4 generations of 2, and tries
    1. The tasks keep a CPU busy as long as they hold the GPU: K of CPU-light tasks is never
    lowered below the CPUs (``sizing.cpu_floor``), which on this 2-CPU machine is the cap."""
    busy = "import time; e = time.time() + 0.8; [0 for _ in iter(lambda: time.time() < e, False)]"
    line = f"{one_gpu.client} --seconds 0.3 && {sys.executable} -c '{busy}'"
    for count, name in ((6, "short"), (16, "long")):
        tasks = one_gpu.root / f"{name}.txt"
        tasks.write_text("\n".join([line] * count) + "\n")
        res = one_gpu.run("farm", "--progress", "off", "--dir", name, str(tasks), timeout=120)
        assert res.returncode == 0, res.stderr
    short, long = (
        json.loads(one_gpu.run("farm", "status", "--json", name).stdout)["packing"][gpu_uuid(0)]
        for name in ("short", "long")
    )
    assert [(c["k"], c["why"]) for c in short["history"]] == [(2, "start"), (2, "hold")]
    assert [(c["k"], c["why"]) for c in long["history"]][:2] == [(2, "start"), (1, "lower")]
