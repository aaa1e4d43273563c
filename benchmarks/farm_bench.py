"""The task farm against what users write by hand, side by side in one run.

N independent tasks of the MLP task worker (``workers/mlp_task.py``: start-up included, about
2 s alone on an H100) are run three ways on GPU 0:

- ``serial``: one after another, no MPS (the loop users start from);
- ``rawmps-waves``: waves of K at once (``&`` and ``wait``) under an MPS daemon started by
  hand, the daemon's start and ``quit`` included;
- ``farm``: ``mpswrap farm --per-gpu K`` (its daemon's start and teardown included).

Makespan is wall time from the first start to the last exit. ``rawmps-waves`` and ``farm``
are interleaved, ``--repeats`` times each; ``serial`` runs once (it is the slow one). With
``--calibrate``, ``mpswrap calibrate`` runs on the same worker and its JSON is kept. Results
append to ``--out`` (resumable: what is there is not run again).

    python benchmarks/farm_bench.py --out benchmarks/results/DATE-h100-farm.json
    python benchmarks/farm_bench.py --out F --parts calibrate --counts 1,2,4,8,12,16
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from revision import revision  # noqa: E402
from run import PY, Results, machine_meta, raw_mps  # noqa: E402

PARTS = ("alone", "serial", "compare", "calibrate")


def task_argv(steps: int, seed: int | str) -> list[str]:
    return [PY, str(HERE / "workers" / "mlp_task.py"), "--steps", str(steps), "--seed", str(seed)]


def _run_all(argvs: list[list[str]], env: dict[str, str], timeout: float) -> None:
    procs = [subprocess.Popen(a, env=env, stdout=subprocess.DEVNULL) for a in argvs]
    codes = [p.wait(timeout=timeout) for p in procs]
    if any(codes):
        raise RuntimeError(f"exit codes {codes}")


def serial(n: int, steps: int, tmp: Path) -> float:
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(tmp / "no-mps"))
    start = time.monotonic()
    for seed in range(n):
        _run_all([task_argv(steps, seed)], env, 600)
    return time.monotonic() - start


def waves(n: int, k: int, steps: int, tmp: Path) -> float:
    """Waves of K under a daemon started by hand: what a user writes with ``&`` and ``wait``."""
    start = time.monotonic()
    with raw_mps(tmp) as mps_env:
        env = dict(os.environ, **mps_env)
        for first in range(0, n, k):
            _run_all([task_argv(steps, s) for s in range(first, min(n, first + k))], env, 600)
    return time.monotonic() - start


def farm(n: int, k: int, steps: int, tmp: Path) -> float:
    tasks = tmp / "tasks.txt"
    tasks.write_text("".join(" ".join(task_argv(steps, s)) + "\n" for s in range(n)))
    env = dict(os.environ, MPSWRAP_USER_RUN_DIR=str(tmp / "run"))
    argv = [
        PY,
        "-m",
        "mpswrap",
        "farm",
        "--gpus",
        "0",
        "--per-gpu",
        str(k),
        "--progress",
        "off",
        "--dir",
        str(tmp / "farm"),
        str(tasks),
    ]
    start = time.monotonic()
    res = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=900)
    took = time.monotonic() - start
    if res.returncode:
        raise RuntimeError(f"farm exit {res.returncode}: {res.stderr[-2000:]}")
    return took


def _fresh() -> Path:
    return Path(tempfile.mkdtemp(prefix="mpsf-", dir="/tmp"))


def measure(res: Results, key: str, what: str, fn: object, *args: object) -> None:
    if res.has(key):
        return
    tmp = _fresh()
    try:
        took = fn(*args, tmp)  # type: ignore[operator]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res.add(key, {"what": what, "makespan_s": round(took, 3)})


def calibrate(res: Results, steps: int, counts: str, repeats: int) -> None:
    if res.has("calibrate"):
        return
    tmp = _fresh()
    try:
        argv = [
            PY,
            "-m",
            "mpswrap",
            "calibrate",
            "--gpus",
            "0",
            "--counts",
            counts,
            "--repeats",
            str(repeats),
            "--json",
            "--dir",
            str(tmp / "cal"),
            "--",
            *task_argv(steps, "$MPSWRAP_TASK")[:-2],
        ]
        env = dict(os.environ, MPSWRAP_USER_RUN_DIR=str(tmp / "run"))
        out = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=1800)
        if out.returncode:
            raise RuntimeError(f"calibrate exit {out.returncode}: {out.stderr[-2000:]}")
        res.add(
            "calibrate",
            {
                "what": "calibrate",
                "counts": counts,
                "repeats": repeats,
                "report": json.loads(out.stdout),
            },
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default="alone,serial,compare", help="of " + ",".join(PARTS))
    ap.add_argument("--tasks", type=int, default=48)
    ap.add_argument("--per-gpu", type=int, default=12)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--counts", default="1,2,4,8,12,16", help="calibrate's counts")
    ap.add_argument("--calibrate-repeats", type=int, default=2)
    args = ap.parse_args()
    parts = args.parts.split(",")
    if set(parts) - set(PARTS):
        ap.error(f"unknown part: {', '.join(sorted(set(parts) - set(PARTS)))}")
    res = Results(args.out)
    res.data["meta"] = {
        **machine_meta(),
        **revision(),
        "tasks": args.tasks,
        "per_gpu": args.per_gpu,
        "steps": args.steps,
    }
    n, k, steps = args.tasks, args.per_gpu, args.steps
    for part in parts:  # in the order given: what matters most first, where time is short
        if part == "alone":
            for rep in range(3):
                measure(res, f"alone-{rep}", "alone", serial, 1, steps)
        elif part == "serial":
            measure(res, "serial", "serial", serial, n, steps)
        elif part == "compare":
            for rep in range(args.repeats):
                order = [("rawmps-waves", waves), ("farm", farm)]
                for name, fn in order if rep % 2 == 0 else order[::-1]:
                    measure(res, f"{name}-{rep}", name, fn, n, k, steps)
        else:
            calibrate(res, steps, args.counts, args.calibrate_repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
