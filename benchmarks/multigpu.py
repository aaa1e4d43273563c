"""mpswrap on a node of several GPUs (issue 43): the prolog's and the epilog's time for jobs of
1, 2 and 4 GPUs, and a farm over the GPUs against raw MPS per GPU.

    python benchmarks/multigpu.py --out benchmarks/results/DATE-h100x4-multigpu.json
    python benchmarks/multigpu.py --out F --parts hooks --counts 1,2,4 --repeats 7
    python benchmarks/multigpu.py --report F

Parts, each for every GPU count of ``--counts`` (the farm: of ``--farm-counts``, if given)
that the machine has (the others are left out, and said so):

- ``hooks``: a job's prolog, then its epilog, as slurmd runs them (root, the job's variables,
  no clients: ``overhead.Bench``, the measurement ``startup_ab.py --gpu --gpus 1,2,4`` makes
  of two trees side by side), for a job of each GPU count; the counts interleaved, each round
  in another order; ``--repeats`` rounds. Goal: a job of 4 GPUs within 1.3x of one of 1 (a
  node's daemons started and ended side by side).
- ``farm``: the same tasks (``--tasks-per-gpu`` small MLP trainings for each GPU,
  ``workers/mlp_task.py``: PyTorch's import and CUDA's start included, as a farm's tasks have
  them) at the same concurrency, ``--per-gpu`` K on each GPU, two ways: ``mpswrap farm --gpus
  0,..,N-1 --per-gpu K``, and raw MPS by hand (a daemon per GPU, the tasks dealt out to the
  GPUs in turn, on each a pool of K that starts the next task as one ends, as ``xargs -P K``
  does). Wall time of the whole command, from its start to its end, the daemons' start and
  stop included; ``--repeats`` rounds, the order alternating. Goal: mpswrap's throughput
  (raw's wall time over mpswrap's, medians) at least 0.98 of raw MPS's.

Results append to ``--out`` as they come (resumable: what is there is not run again; a run
starts only if the longest of its kind so far still fits in ``--budget`` seconds). The tables
(medians with each round's figure and the spread) are printed at the end, or by ``--report``.
``--simulate``: the hooks against the MPS simulator (the farm part runs on whatever
``nvidia-cuda-mps-control`` and GPUs mpswrap finds: the simulator's in the functional test).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from farm_bench import Clock, task_argv  # noqa: E402
from overhead import HOOKS, Bench, _median, compiled  # noqa: E402
from revision import revision  # noqa: E402
from run import PY, Results, gpu_uuids, machine_meta, raw_mps_per_gpu, rotated  # noqa: E402

PARTS = ("hooks", "farm")
MODES = ("rawmps", "mpswrap")
#: A farm or a task that hangs must not take the whole 10-minute call.
FARM_TIMEOUT = 300
#: The issue's goals.
HOOKS_GOAL, FARM_GOAL = 1.3, 0.98


# --- hooks --------------------------------------------------------------------------------------
def part_hooks(res: Results, counts: list[int], repeats: int, simulate: bool) -> None:
    """Prolog and epilog of a job of each GPU count, the counts interleaved; one record per
    count once every round ran (a new visit runs the count again)."""
    todo = [g for g in counts if not res.has(f"hooks/gpus{g}")]
    if not todo:
        return
    compiled()
    benches = {g: Bench(simulate, g) for g in todo}
    times: dict[int, dict[str, list[float]]] = {g: {hook: [] for hook in HOOKS} for g in todo}
    for r in range(repeats):
        for g in rotated(tuple(todo), r):
            for hook, took in benches[g].hooks(f"m{g}r{r}").items():
                times[g][hook].append(took)
    most = max(todo)
    for g in todo:
        res.add(
            f"hooks/gpus{g}",
            {
                "what": "hooks",
                "gpus": g,
                "simulated": simulate,
                **{hook: {**_median(t), "runs_ms": _ms(t)} for hook, t in times[g].items()},
                **({"trace": _traced(benches[g], f"m{g}trace")} if g == most else {}),
            },
        )


def _traced(bench: Bench, job: str) -> dict[str, list[str]]:
    """One more prolog and epilog of the bench's job, untimed, at log level debug: each line
    stamped with its millisecond (where a GPU's start goes: cgroup and record, '-d', the
    daemon's first answer)."""
    with (bench.tmp / "mpswrap.conf").open("a") as conf:
        conf.write("log_level = debug\n")
    lines: dict[str, list[str]] = {}
    for hook in HOOKS:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "mpswrap", hook],
                env=bench.env(job),
                capture_output=True,
                text=True,
                timeout=120,
                cwd="/",
            )
        except subprocess.TimeoutExpired:  # the timed rounds' figures are kept all the same
            lines[hook] = ["(no answer in 120 s)"]
            continue
        said = [ln for ln in done.stderr.splitlines() if " ms " in ln][-60:]
        lines[hook] = said + ([f"(exit {done.returncode})"] if done.returncode else [])
    return lines


def _ms(seconds: list[float]) -> list[float]:
    return [round(s * 1000, 1) for s in seconds]


# --- farm ---------------------------------------------------------------------------------------
def run_farm(argvs: list[list[str]], gpus: int, k: int, tmp: Path) -> dict[str, Any]:
    """``mpswrap farm`` of the tasks on the first ``gpus`` GPUs, K on each: its wall time and
    what its ``farm status`` counts."""
    tasks, farm_dir = tmp / "tasks.txt", tmp / "farm"
    tasks.write_text("".join(shlex.join(a) + "\n" for a in argvs))
    env = dict(os.environ, MPSWRAP_USER_RUN_DIR=str(tmp / "run"))
    which = ",".join(map(str, range(gpus)))
    argv = [PY, "-m", "mpswrap", "farm", "--gpus", which, "--per-gpu", str(k), "--progress"]
    argv += ["off", "--dir", str(farm_dir), str(tasks)]
    start = time.monotonic()
    ran = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=FARM_TIMEOUT)
    wall = time.monotonic() - start
    status = subprocess.run(
        [PY, "-m", "mpswrap", "farm", "status", "--json", str(farm_dir)],
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
    )
    if ran.returncode == 2 or status.returncode:
        raise RuntimeError(f"farm exit {ran.returncode}: {ran.stderr[-2000:]}{status.stderr}")
    counts = json.loads(status.stdout)
    return {"wall_s": round(wall, 3), "done": counts["done"], "failed": len(argvs) - counts["done"]}


def run_raw(argvs: list[list[str]], gpus: int, k: int, tmp: Path) -> dict[str, Any]:
    """The tasks under MPS by hand on the first ``gpus`` GPUs: a daemon per GPU, the tasks
    dealt out to the GPUs in turn, on each GPU a pool of K that starts the next as one ends."""
    uuids = gpu_uuids()[:gpus]
    start = time.monotonic()
    with raw_mps_per_gpu(tmp, uuids) as envs:
        pools = [ThreadPoolExecutor(k) for _ in uuids]
        try:
            futures = [
                pool.submit(_task, argv, {**os.environ, **envs[uuid]})
                for i, (pool, uuid) in enumerate(zip(pools, uuids, strict=True))
                for argv in argvs[i :: len(uuids)]
            ]
            codes = [f.result() for f in futures]
        finally:
            for pool in pools:
                pool.shutdown()
    wall = time.monotonic() - start
    failed = sum(1 for code in codes if code)
    return {"wall_s": round(wall, 3), "done": len(codes) - failed, "failed": failed}


def _task(argv: list[str], env: dict[str, str]) -> int:
    done = subprocess.run(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=FARM_TIMEOUT
    )
    return done.returncode


RUNNERS: dict[str, Callable[[list[list[str]], int, int, Path], dict[str, Any]]] = {
    "rawmps": run_raw,
    "mpswrap": run_farm,
}


def part_farm(res: Results, counts: list[int], args: argparse.Namespace, clock: Clock) -> bool:
    """Both ways, every count, ``repeats`` rounds interleaved; False when the budget ran out."""
    for rep in range(args.repeats):
        for g in counts:
            argvs = [task_argv(args.steps, seed) for seed in range(args.tasks_per_gpu * g)]
            for mode in rotated(MODES, rep):
                key = f"farm/gpus{g}/{mode}/r{rep}"
                if res.has(key):
                    continue
                if not clock.allows(f"farm{g}"):
                    return False
                tmp = Path(tempfile.mkdtemp(prefix="mpsm-", dir="/tmp"))
                try:
                    run = RUNNERS[mode](argvs, g, args.per_gpu, tmp)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                clock.took(f"farm{g}", run["wall_s"])
                res.add(key, _farm_record(g, mode, rep, len(argvs), args, run))
    return True


def _farm_record(
    g: int, mode: str, rep: int, tasks: int, args: argparse.Namespace, run: dict[str, Any]
) -> dict[str, Any]:
    return {
        "what": "farm",
        "gpus": g,
        "mode": mode,
        "rep": rep,
        "tasks": tasks,
        "per_gpu": args.per_gpu,
        "steps": args.steps,
        **run,
        "throughput_tasks_per_s": round(tasks / run["wall_s"], 3),
    }


# --- the tables ---------------------------------------------------------------------------------
def report(data: dict[str, Any]) -> str:
    """The hooks' and the farm's tables, in markdown, from the runs of a results file."""
    meta, runs = data.get("meta", {}), data["runs"]
    lines = [
        f"{meta.get('gpu', '?')}, driver {meta.get('driver', '?')}, torch "
        f"{meta.get('torch', '-')}, commit {str(meta.get('commit', '?'))[:12]}",
        "",
        *_hooks_table([r for r in runs if r.get("what") == "hooks"]),
        "",
        *_farm_table([r for r in runs if r.get("what") == "farm"]),
    ]
    return "\n".join(lines)


def _hooks_table(runs: list[dict[str, Any]]) -> list[str]:
    if not runs:
        return ["(no hooks runs)"]
    by_gpus = {r["gpus"]: r for r in runs}
    one = by_gpus.get(1)
    out = [
        "| GPUs | prolog median ms (min-max) | epilog median ms (min-max) | prolog / 1 GPU |",
        "|---|---|---|---|",
    ]
    for g, r in sorted(by_gpus.items()):
        ratio = f"{r['prolog']['median_ms'] / one['prolog']['median_ms']:.2f}" if one else "-"
        cells = [f"{_spread(r[h])}" for h in HOOKS]
        out.append(f"| {g} | {cells[0]} | {cells[1]} | {ratio} |")
    four = by_gpus.get(4)
    if one and four:
        ratio = four["prolog"]["median_ms"] / one["prolog"]["median_ms"]
        met = "met" if ratio <= HOOKS_GOAL else "not met"
        out += ["", f"Prolog of 4 GPUs / 1 GPU: {ratio:.2f} (goal <= {HOOKS_GOAL}: {met})."]
    return out


def _spread(stats: dict[str, float]) -> str:
    return f"{stats['median_ms']:.0f} ({stats['min_ms']:.0f}-{stats['max_ms']:.0f})"


def _farm_table(runs: list[dict[str, Any]]) -> list[str]:
    if not runs:
        return ["(no farm runs)"]
    out = [
        "| GPUs | tasks (K per GPU) | raw MPS wall s, median (runs) | mpswrap farm wall s, "
        "median (runs) | spread raw / mpswrap | mpswrap / raw throughput |",
        "|---|---|---|---|---|---|",
    ]
    failed = [r for r in runs if r["failed"]]
    ratios = []
    for g in sorted({r["gpus"] for r in runs}):
        walls = {m: [r["wall_s"] for r in runs if r["gpus"] == g and r["mode"] == m] for m in MODES}
        mine = [r for r in runs if r["gpus"] == g]
        raw, wrapped = walls["rawmps"], walls["mpswrap"]
        ratio = statistics.median(raw) / statistics.median(wrapped) if raw and wrapped else None
        ratios.append(ratio)
        out.append(
            f"| {g} | {mine[0]['tasks']} ({mine[0]['per_gpu']}) | {_walls(raw)} | "
            f"{_walls(wrapped)} | {_rel(raw)} / {_rel(wrapped)} | "
            f"{'-' if ratio is None else f'{ratio:.3f}'} |"
        )
    known = [r for r in ratios if r is not None]
    if known:
        met = "met" if min(known) >= FARM_GOAL else "not met"
        out += [
            "",
            f"Lowest mpswrap / raw throughput: {min(known):.3f} (goal >= {FARM_GOAL}: {met}).",
        ]
    if failed:
        out += ["", f"Runs with failed tasks (not figures): {', '.join(r['key'] for r in failed)}."]
    return out


def _walls(walls: list[float]) -> str:
    if not walls:
        return "-"
    return f"{statistics.median(walls):.2f} ({', '.join(f'{w:.2f}' for w in walls)})"


def _rel(walls: list[float]) -> str:
    """(max - min) / median."""
    return f"{(max(walls) - min(walls)) / statistics.median(walls):.0%}" if walls else "-"


# --- main ---------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, help="the results file (appended, resumable)")
    ap.add_argument("--report", type=Path, metavar="FILE", help="print FILE's tables, run nothing")
    ap.add_argument("--parts", default=",".join(PARTS), help="of " + ",".join(PARTS))
    ap.add_argument("--counts", default="1,2,4", help="GPU counts (those the machine has)")
    ap.add_argument("--farm-counts", help="the farm's GPU counts, if not --counts")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of each measurement")
    ap.add_argument("--tasks-per-gpu", type=int, default=16, help="farm: tasks for each GPU")
    ap.add_argument("--per-gpu", type=int, default=8, help="farm: tasks at once on each GPU")
    ap.add_argument("--steps", type=int, default=2000, help="farm: training steps of a task")
    ap.add_argument("--budget", type=float, default=480, help="seconds before stopping")
    ap.add_argument("--simulate", action="store_true", help="hooks against the MPS simulator")
    return ap


def _counts(text: str) -> list[int]:
    """The GPU counts asked for that this machine has; those it lacks are said and left out."""
    have = len(gpu_uuids())
    asked = [int(c) for c in text.split(",")]
    counts = [c for c in asked if c <= have]
    if counts != asked:
        print(f"this machine has {have} GPU(s): counts {sorted(set(asked) - set(counts))} left out")
    return counts


def main() -> int:
    args = _parser().parse_args()
    if args.report:
        print(report(json.loads(args.report.read_text())))
        return 0
    if not args.out:
        _parser().error("--out or --report is needed")
    parts = args.parts.split(",")
    if set(parts) - set(PARTS):
        _parser().error(f"unknown part: {', '.join(sorted(set(parts) - set(PARTS)))}")
    counts, farm_counts = _counts(args.counts), _counts(args.farm_counts or args.counts)
    clock = Clock(args.budget)
    res = Results(args.out)
    res.data["meta"] = {**machine_meta(), **revision()}
    done = True
    if "hooks" in parts:
        part_hooks(res, counts, args.repeats, args.simulate)
    if "farm" in parts:
        done = part_farm(res, farm_counts, args, clock)
    if not done:
        print("budget reached; run again with the same --out to fill the gaps", flush=True)
    print(report(res.data), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
