"""The CPU overhead benchmarks in their quick mode (MPS simulator, fake GPUs): they run, write
their JSON, and the report renders it. Timings are recorded, never asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from mpswrap import _proc
from mpswrap.mps.gpu import load_inventory
from tests.placed import placed
from tests.simenv import SimNode, sim_node
from tests.tree import REPO
from tests.waits import wait_until

pytestmark = pytest.mark.functional
EXPECTED = {
    *(f"overhead/sim/prolog/gpus{g}" for g in (1, 2, 4, 8)),
    "overhead/sim/supervisor",
    "overhead/sim/epilog/clients0",
    "overhead/sim/epilog/clients12",
}


@pytest.mark.timeout(600)
def test_quick_overhead_benchmarks_write_json_and_render(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    run = [sys.executable, str(REPO / "benchmarks" / "run.py"), "--quick", "--out", str(out)]
    res = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=540)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    runs = {r["key"]: r for r in data["runs"]}
    assert set(runs) == EXPECTED
    assert all(r["simulated"] for r in runs.values())
    for r in runs.values():
        for measure in ("prolog", "epilog_no_clients", "epilog", "status", "start"):
            if measure in r:
                assert 0 < r[measure]["min_ms"] <= r[measure]["median_ms"] <= r[measure]["max_ms"]
    assert runs["overhead/sim/supervisor"]["rss_mib"] > 0
    assert runs["overhead/sim/supervisor"]["guard_uss_mib"] is not None, "no guard measured"
    report = [sys.executable, str(REPO / "benchmarks" / "report.py"), str(out)]
    shown = subprocess.run(report, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "| sim/supervisor | start |" in shown and "| sim/epilog/clients12 | epilog |" in shown


@pytest.fixture
def sim() -> Iterator[SimNode]:
    with sim_node(gpus=1) as node:
        yield node


def _bench(sim: SimNode, out: Path, *args: str) -> dict[str, dict[str, Any]]:
    """benchmarks/run.py with the workers as CPU stand-ins on the simulated node; its runs."""
    argv = [sys.executable, str(REPO / "benchmarks" / "run.py"), "--out", str(out), *args]
    path = f"{sim.bin}:{os.environ['PATH']}"
    env = sim.env(PATH=path, PYTHONPATH=str(REPO), MPS_BENCH_WORKER="stand-in")
    res = subprocess.run(argv, env=env, cwd=out.parent, capture_output=True, text=True, timeout=540)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return {r["key"]: r for r in json.loads(out.read_text())["runs"]}


def _check_workers(sim: SimNode, runs: dict[str, dict[str, Any]]) -> None:
    """Each run's workers are MPS clients exactly where they should be, each on the GPU
    ``mpswrap run`` gives its rank, in every mode alike (raw MPS: a daemon per GPU)."""
    gpus = [gpu.uuid for gpu in load_inventory(str(sim.inventory)).gpus]
    for key, run in runs.items():
        assert len(run["workers"]) == run["n"], key
        attached = {w["mps"] for w in run["workers"]}
        assert attached == {run["mode"] != "timesliced"}, f"{key}: MPS clients {attached}"
        on = Counter(w["gpu"] for w in run["workers"])
        assert on == Counter(placed("block", run["n"], gpus)), f"{key}: workers by GPU {on}"


MODES = "timesliced,rawmps,mpswrap,mpswrap-daemon"


@pytest.mark.timeout(600)
def test_throughput_and_provisioning_phases_run_every_mode_on_the_simulator(
    sim: SimNode, tmp_path: Path
) -> None:
    """The GPU phases with the workers as CPU stand-ins (benchmarks/workers/protocol.py): every
    mode and policy runs, its workers are MPS clients exactly where they should be, each
    mixed-set worker gets the weight and the thread share its policy gives it, and the report
    renders."""
    out = tmp_path / "bench.json"
    args = ["--phases", "mlp,nbody,provision", "--modes", MODES, "--ns", "1,3", "--repeats", "1"]
    runs = _bench(sim, out, *args, "--mlp-steps", "40", "--nbody-steps", "20")
    plain = MODES.split(",")
    expected = {f"{w}/{m}/n{n}/r0" for w in ("mlp", "nbody") for m in plain for n in (1, 3)}
    expected |= {"mixed/timesliced/n10/r0", "mixed/rawmps/n10/r0", "mixed/mpswrap-daemon/n10/r0"}
    expected |= {
        f"mixed/mpswrap-{p}/n10/r0"
        for p in ("none", "uniform", "oversubscribe", "4-4-1-1-1-1-1-1-1-1")
    }
    assert set(runs) == expected
    _check_workers(sim, runs)
    shares: dict[str, Sequence[str | None]] = {
        "none": [None] * 10,
        "uniform": ["10"] * 10,
        "oversubscribe": ["20"] * 10,
        "4-4-1-1-1-1-1-1-1-1": ["25"] * 2 + ["6.2"] * 8,
    }
    for policy, want in shares.items():
        workers = runs[f"mixed/mpswrap-{policy}/n10/r0"]["workers"]
        got = sorted(((w["weight"], w["threads"]) for w in workers), reverse=True)
        assert got == sorted(zip([4, 4] + [1] * 8, want, strict=False), reverse=True), policy
    assert sorted(w["weight"] for w in runs["mixed/rawmps/n10/r0"]["workers"]) == [1] * 8 + [4] * 2
    report = [sys.executable, str(REPO / "benchmarks" / "report.py"), str(out)]
    shown = subprocess.run(report, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "Workload `nbody`" in shown and "Workload `mixed`" in shown
    assert "| mpswrap --threads uniform |" in shown, shown


@pytest.mark.timeout(300)
def test_every_mode_runs_as_many_workers_on_each_of_two_gpus(tmp_path: Path) -> None:
    """On a node of two GPUs, workers started by hand go where mpswrap run puts its ranks,
    each seeing only its GPU, and raw MPS is a daemon per GPU (as an admin runs it): a
    worker left to see both GPUs under a one-GPU daemon fails (PyTorch asserts,
    gpu-lab.md)."""
    with sim_node(gpus=2) as two:
        args = ["--phases", "mlp", "--modes", MODES, "--ns", "1,3,4", "--repeats", "1"]
        runs = _bench(two, tmp_path / "bench.json", *args, "--mlp-steps", "40")
        assert set(runs) == {f"mlp/{m}/n{n}/r0" for m in MODES.split(",") for n in (1, 3, 4)}
        _check_workers(two, runs)


@pytest.mark.timeout(300)
def test_multigpu_benchmark_runs_each_part_for_the_gpu_counts_the_node_has(tmp_path: Path) -> None:
    """benchmarks/multigpu.py on two simulated GPUs, the tasks as CPU stand-ins: the hooks of
    jobs of 1 and 2 GPUs (4 left out: the node has 2), the farm each way and every task done;
    a second call runs nothing again; ``--report`` prints both tables."""
    out = tmp_path / "multigpu.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "multigpu.py"), "--out", str(out)]
    argv += ["--simulate", "--counts", "1,2,4", "--repeats", "1", "--tasks-per-gpu", "3"]
    argv += ["--per-gpu", "2", "--steps", "100"]
    with sim_node(gpus=2) as two:
        path = f"{two.bin}:{os.environ['PATH']}"
        env = two.env(PATH=path, PYTHONPATH=str(REPO), MPS_BENCH_WORKER="stand-in")
        for _ in range(2):
            res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
            assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "counts [4] left out" in res.stdout
    runs = {r["key"]: r for r in json.loads(out.read_text())["runs"]}
    farm = {f"farm/gpus{g}/{m}/r0" for g in (1, 2) for m in ("rawmps", "mpswrap")}
    assert set(runs) == {"hooks/gpus1", "hooks/gpus2", *farm}, "the second call ran again"
    for key in farm:
        assert (runs[key]["tasks"], runs[key]["failed"]) == (3 * runs[key]["gpus"], 0), runs[key]
    for g in (1, 2):
        hooks = runs[f"hooks/gpus{g}"]
        assert all(0 < hooks[h]["min_ms"] <= hooks[h]["max_ms"] for h in ("prolog", "epilog"))
    # The largest count's prolog once more at debug: where each GPU's start went.
    trace = runs["hooks/gpus2"]["trace"]["prolog"]
    assert any("2 daemon(s) launched in" in line for line in trace), trace
    assert sum("the daemon answered" in line for line in trace) == 2, trace
    assert "trace" not in runs["hooks/gpus1"]
    report = [sys.executable, str(REPO / "benchmarks" / "multigpu.py"), "--report", str(out)]
    shown = subprocess.run(report, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "| 2 | 6 (2) |" in shown and "prolog / 1 GPU" in shown, shown


@pytest.mark.timeout(120)
def test_start_trace_profiles_a_rank_up_to_its_programs_spawn() -> None:
    """The diagnosis of the supervisor's start runs on the simulator: it stops at the spawn,
    before which a rank on the prolog's daemons has loaded neither NVML nor psutil."""
    run = [sys.executable, str(REPO / "benchmarks" / "start_trace.py"), str(REPO)]
    res = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=100)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "TRACE modules=" in res.stdout, res.stdout[-3000:]
    assert "pynvml=False psutil=False" in res.stdout
    assert "cumulative" in res.stdout  # the profile's table


@pytest.mark.timeout(600)
def test_farm_benchmark_sets_run_each_way_on_the_simulator_resume_and_report(
    sim: SimNode, tmp_path: Path
) -> None:
    """benchmarks/farm_bench.py's three task sets (issue 33) with tiny sizes, the workers as
    CPU stand-ins: every (mode, K) of each set runs, interleaved, every task done; today's
    default is run once where it equals a fixed K; a second call runs nothing again; a spent
    budget starts nothing; the report prints each set's table and verdicts. ``auto`` is left
    out here: it is mpswrap farm's ``--per-gpu auto``."""
    out = tmp_path / "farm.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "farm_bench.py"), "--out", str(out)]
    argv += ["--modes", "fixed,default,waves", "--repeats", "2", "--best-k", "2"]
    argv += ["--default-k", "3", "--mem-k", "1,2", "--light", "3", "--steps", "50"]
    argv += ["--hetero", "2,1", "--heavy-steps", "300", "--memory", "3", "--gib", "1"]
    argv += ["--hold", "0.05"]
    path = f"{sim.bin}:{os.environ['PATH']}"
    env = sim.env(PATH=path, PYTHONPATH=str(REPO), MPS_BENCH_WORKER="stand-in")
    res = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=540)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    runs = {r["key"]: r for r in data["runs"]}
    ways = {"light": ("fixed-k2", "default-k3", "waves-k2"), "memory": ("fixed-k1", "fixed-k2")}
    ways["hetero"] = ways["light"]
    ways["memory"] += ("default-k3",)
    assert set(runs) == {f"{s}/{w}/r{rep}" for s, ws in ways.items() for w in ws for rep in (0, 1)}
    order = [r["key"] for r in data["runs"] if r["key"].startswith("light/")]
    assert order[0].split("/")[1] != order[3].split("/")[1], "repeats interleaved, rotated"
    for key, run in runs.items():
        want = {"light": 3, "hetero": 3, "memory": 3}[run["set"]]
        assert (run["tasks"], run["done"], run["failed"]) == (want, want, 0), key
        assert run["makespan_s"] > (0.3 if run["set"] == "hetero" else 0), f"{key}: heavy ran"
    assert data["meta"]["best_k_from"] == "--best-k" and data["meta"]["sizes"]["light"] == 3
    shown = res.stdout
    for name in ("light", "hetero", "memory"):
        assert f"Set `{name}`:" in shown, shown
    assert "| raw MPS waves of K=2 |" in shown and "| today's default K=3 |" in shown, shown
    assert "auto / best fixed K: not measured" in shown, shown
    again = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(json.loads(out.read_text())["runs"]) == len(runs), "nothing runs twice"
    spent = [*argv[:3], str(tmp_path / "spent.json"), *argv[4:], "--budget", "0"]
    res = subprocess.run(spent, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "budget reached" in res.stdout, res.stderr[-3000:]
    assert not (tmp_path / "spent.json").exists(), "nothing ran, nothing written"


def test_farm_benchmark_auto_known_starts_from_what_auto_learned(
    sim: SimNode, tmp_path: Path
) -> None:
    """farm_bench.py's two auto ways on a tiny light set: ``auto`` starts from no profile and
    leaves what it learned as the set's profile (beside the results file); ``auto-known``
    starts from that, even when listed first; the report judges each."""
    out = tmp_path / "farm.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "farm_bench.py"), "--out", str(out)]
    argv += ["--parts", "light", "--modes", "auto-known,auto,fixed", "--repeats", "1"]
    argv += ["--best-k", "2", "--default-k", "2", "--light", "3", "--steps", "50"]
    path = f"{sim.bin}:{os.environ['PATH']}"
    env = sim.env(PATH=path, PYTHONPATH=str(REPO), MPS_BENCH_WORKER="stand-in")
    res = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    keys = [r["key"] for r in json.loads(out.read_text())["runs"]]
    assert keys.index("light/auto/r0") < keys.index("light/auto-known/r0"), keys
    learned = json.loads((tmp_path / "farm.profiles" / "light.json").read_text())
    assert learned, "the auto run left no profile"
    assert "auto, known commands / best fixed K (fixed K=2) throughput:" in res.stdout, res.stdout


@pytest.mark.timeout(300)
def test_farm_beside_gnu_parallel_quick_runs_and_records(tmp_path: Path) -> None:
    """benchmarks/farm_parallel.py --quick (issue 44): the farm and, where installed, GNU
    parallel and HyperQueue run the same ``true`` tasks; the record has each one's seconds, the
    ratio, and the bigger farm's peak RSS. Not timed: the figures are docs/benchmarks.md's."""
    out = tmp_path / "par.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "farm_parallel.py"), "--quick"]
    res = subprocess.run(
        [*argv, "--out", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=280
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    farm = data["true"]["farm"]
    assert farm["exit_code"] == 0 and farm["left"] == [] and farm["seconds"] > 0
    assert data["flat"]["exit_code"] == 0 and data["flat"]["peak_rss_kib"] > 0
    if data["true"]["parallel"] is not None:
        assert data["farm_over_parallel"] is not None
    assert "farm / parallel:" in res.stdout and "farm peak RSS" in res.stdout


@pytest.mark.timeout(300)
def test_proc_scans_finds_the_same_processes_both_ways_and_records_them(tmp_path: Path) -> None:
    """benchmarks/proc_scans.py with few processes: psutil's way and mpswrap's find the same
    trees and the same processes naming the pipe (the script asserts it), each round is
    recorded, and nothing it started is left. Not timed: the figures are benchmarks.md's."""
    out = tmp_path / "scans.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "proc_scans.py"), "--extra", "20"]
    res = subprocess.run(
        [*argv, "--rounds", "2", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [r["round"] for r in data["runs"]] == [0, 1]
    assert data["meta"]["ranks"] == 48 and data["meta"]["extra"] == 20

    def left() -> list[int]:
        found = _proc.procs_with_env("CUDA_MPS_PIPE_DIRECTORY")
        return [p.pid for p, env in found if "/proc-scans-" in env["CUDA_MPS_PIPE_DIRECTORY"]]

    wait_until(lambda: not left(), 30, "the script's processes to be gone")
