"""benchmarks/farm_bench.py's plan and benchmarks/farm_report.py's verdicts (issue 33's
acceptance), from forged results: which (mode, K) each set runs, and when a ratio is met."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

from tests.tree import REPO


def _module(name: str) -> ModuleType:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


bench = _module("farm_bench")
report = _module("farm_report")


def test_each_set_runs_auto_fixed_default_and_waves_default_once_where_it_is_fixed() -> None:
    modes = ["auto", "fixed", "default", "waves"]
    assert bench.variants("light", modes, 16, 16, [3]) == [
        ("auto", None),
        ("fixed", 16),
        ("waves", 16),
    ]
    assert bench.variants("hetero", modes, 8, 16, [3]) == [
        ("auto", None),
        ("fixed", 8),
        ("default", 16),
        ("waves", 8),
    ]
    assert bench.variants("memory", modes, 16, 16, [2, 3]) == [
        ("auto", None),
        ("fixed", 2),
        ("fixed", 3),
        ("default", 16),
    ]
    # Without the fixed mode, the default runs even where it equals a fixed K.
    assert bench.variants("light", ["default"], 16, 16, [3]) == [("default", 16)]


def test_the_hetero_set_spreads_its_heavy_tasks() -> None:
    sizes = bench.Sizes(hetero_light=18, hetero_heavy=4, steps=2000, heavy_steps=12000)
    steps = [int(argv[argv.index("--steps") + 1]) for argv in bench.task_set("hetero", sizes)]
    heavy = [i for i, s in enumerate(steps) if s == 12000]
    assert len(steps) == 22 and heavy == [2, 8, 13, 19]


def _run(name: str, mode: str, k: int | None, seconds: float, **counts: Any) -> dict[str, Any]:
    tasks = counts.pop("tasks", 10)
    base = {"what": "set", "set": name, "mode": mode, "k": k, "makespan_s": seconds}
    return {**base, "tasks": tasks, "done": tasks, "failed": 0, "oom": 0, **counts}


def _data(*runs: dict[str, Any]) -> dict[str, Any]:
    return {"meta": {}, "runs": list(runs)}


def test_auto_is_judged_against_the_best_fixed_k_that_never_failed() -> None:
    runs = [_run("light", "auto", None, s, packing={"GPU-0": {"k": 12}}) for s in (10.4, 10.5, 11)]
    runs += [_run("light", "fixed", 16, s) for s in (10, 10, 10)]
    runs += [_run("light", "fixed", 32, 5, done=9, failed=1)] * 3  # fast, but it lost a task
    runs += [_run("light", "waves", 16, 12)] * 3
    shown = report.render(_data(*runs))
    assert "auto / best fixed K (fixed K=16) throughput: 0.952 (target >= 0.95): met" in shown
    assert "| auto (final K 12) | 10.5 (10.4-11.0, 3 runs) |" in shown
    slow = [*runs[3:], *(_run("light", "auto", None, 10.6) for _ in range(3))]
    assert "throughput: 0.943 (target >= 0.95): NOT met" in report.render(_data(*slow))
    few = [runs[0], *runs[3:]]
    assert "fewer than 3 runs: auto (final K 12)" in report.render(_data(*few))


def test_memory_wants_the_default_failing_auto_clean_and_within_ten_percent() -> None:
    runs = [_run("memory", "default", 16, 12, done=3, failed=0, oom=7)] * 3
    runs += [_run("memory", "fixed", 3, 30)] * 3
    runs += [_run("memory", "auto", None, s) for s in (32, 33, 34)]
    shown = report.render(_data(*runs))
    assert "today's default K=16: tasks failed or oom in 3 of 3 runs" in shown
    assert ": shown failing" in shown
    assert "auto: 0 failed, 0 oom over all runs: 0 failures met" in shown
    assert "(fixed K=3) makespan: 1.100 (target <= 1.1): met" in shown
    lost = [*runs[:6], *(_run("memory", "auto", None, 30, done=9, failed=1) for _ in range(3))]
    assert "auto: 3 failed, 0 oom over all runs: 0 failures NOT met" in report.render(_data(*lost))
    passing = [_run("memory", "default", 16, 12)] * 3 + runs[3:]
    assert "in 0 of 3 runs (0 failed, 0 oom): NOT failing" in report.render(_data(*passing))


def test_auto_known_runs_beside_auto_and_is_judged_on_its_own() -> None:
    """auto-known (the farm started from what an auto run of the same set learned) is one
    more way of each set, with a verdict of its own beside auto's."""
    modes = ["auto", "auto-known", "fixed"]
    assert bench.variants("light", modes, 16, 16, [3]) == [
        ("auto", None),
        ("auto-known", None),
        ("fixed", 16),
    ]
    runs = [_run("light", "auto", None, 11) for _ in range(3)]
    runs += [_run("light", "auto-known", None, 10.4, packing={"GPU-0": {"k": 16}})] * 3
    runs += [_run("light", "fixed", 16, 10)] * 3
    shown = report.render(_data(*runs))
    assert "auto / best fixed K (fixed K=16) throughput: 0.909 (target >= 0.95): NOT met" in shown
    assert (
        "auto, known commands / best fixed K (fixed K=16) throughput: 0.962 "
        "(target >= 0.95): met" in shown
    )
    assert "| auto, known commands (final K 16) | 10.4 (10.4-10.4, 3 runs) |" in shown
    memory = [_run("memory", "fixed", 3, 30)] * 3
    memory += [_run("memory", "auto-known", None, 31, oom=1)] * 3
    shown = report.render(_data(*memory))
    assert "auto, known commands: 0 failed, 3 oom over all runs: 0 failures NOT met" in shown
