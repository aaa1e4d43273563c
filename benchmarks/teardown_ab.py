"""Root's ``status`` and the epilog with K live clients, two mpswrap trees side by side.

    git worktree add /tmp/base <commit>
    python benchmarks/teardown_ab.py /tmp/base . --clients 48 --rounds 3 --gpu --out <file>.json

Each round measures both trees, one after the other (the order alternates), against the real
GPU and MPS (``--gpu``; else the simulator), with this checkout's ``overhead.py`` pointed at the
tree's mpswrap: a one-GPU job's prolog, K clients attached (the CUDA test client, as the job's
user), root's ``mpswrap status --json`` timed once they are all listed (``status_listed``:
some still making their CUDA contexts) and again once each has said it started (``status``:
the clients as they run), then the epilog timed.
Medians over the rounds, and each round's figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from revision import revision, tree_revision

HERE = Path(__file__).resolve().parent
#: This checkout's measuring code, pointed at the tree measured (its mpswrap and simulator).
MEASURE = """
import json, subprocess, sys, time
from pathlib import Path
sys.path[:0] = [{here!r}, {root!r}]
import overhead
overhead.REPO = Path({root!r})
overhead.compiled()
bench = overhead.Bench({simulate!r}, 1)
# Debug lines, each stamped with its millisecond, from every command: where the time went.
with (bench.tmp / "mpswrap.conf").open("a") as conf:
    conf.write("log_level = debug\\n")
job = "ab{round}"
bench.hook("prolog", job)
clients = bench.attach_clients(job, {clients}, said=True)
overhead._wait_listed(bench, job, {clients})
env = dict(bench.env(job), SLURM_SCRIPT_CONTEXT="")
def timed_status():
    t0 = time.perf_counter()
    subprocess.run([overhead.PY, "-m", "mpswrap", "status", "--json"], env=env, check=True,
                   capture_output=True, cwd="/")
    return time.perf_counter() - t0
# Once every client is listed (some still making their CUDA context), then once each has
# said it started (its context up): the job's clients as they run.
status_listed = timed_status()
overhead.wait_started(clients)
status = timed_status()
# Once more, untimed, with its debug lines: where the time went.
trace = subprocess.run([overhead.PY, "-m", "mpswrap", "status", "--json", "-v"], env=env,
                       capture_output=True, text=True, cwd="/").stderr.splitlines()[-80:]
# NVML's calls one by one, as status makes them (the real GPU only), in status's environment.
nvml_trace = [] if {simulate!r} else subprocess.run(
    [overhead.PY, "-c", NVML_PROBE], env=env, capture_output=True, text=True, cwd="/",
    timeout=120).stdout.splitlines()
t0 = time.perf_counter()
done = subprocess.run([overhead.PY, "-m", "mpswrap", "epilog"], env=bench.env(job),
                      capture_output=True, text=True, cwd="/", timeout=120)
epilog = time.perf_counter() - t0
if done.returncode != 0:
    raise SystemExit(f"epilog exited {{done.returncode}}: {{done.stderr[-500:]}}")
for c in clients:
    c.wait(timeout=120)
print(json.dumps({{"status_s": round(status, 3), "epilog_s": round(epilog, 3),
                  "status_listed_s": round(status_listed, 3),
                  "status_trace": trace, "nvml_trace": nvml_trace,
                  "epilog_trace": done.stderr.splitlines()[-120:]}}))
"""
#: Each NVML call status makes, timed on its own, for the GPU the job uses.
NVML_PROBE = """
import time
t0 = time.perf_counter()
def said(what):
    print(f"{(time.perf_counter() - t0) * 1000:.0f} ms {what}", flush=True)
import pynvml as n
said("import")
n.nvmlInit()
said("nvmlInit")
uuid = open("/proc/driver/nvidia/gpus/" + sorted(__import__("os").listdir(
    "/proc/driver/nvidia/gpus"))[0] + "/information").read().split("GPU UUID:")[1].split()[0]
h = n.nvmlDeviceGetHandleByUUID(uuid)
said("handle by uuid")
n.nvmlDeviceGetMemoryInfo(h)
said("memory")
n.nvmlDeviceGetUtilizationRates(h)
said("utilisation")
said(f"compute processes {len(n.nvmlDeviceGetComputeRunningProcesses(h))}")
said(f"MPS compute processes {len(n.nvmlDeviceGetMPSComputeRunningProcesses(h))}")
n.nvmlShutdown()
said("shutdown")
"""


def measure(root: Path, args: argparse.Namespace, round_: int) -> dict[str, float]:
    code = MEASURE.format(
        here=str(HERE), root=str(root), simulate=not args.gpu, clients=args.clients, round=round_
    ).replace("NVML_PROBE", repr(NVML_PROBE))
    out = subprocess.run(
        [args.python, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs=2, type=Path, help="two checkouts: base, then changed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=48)
    ap.add_argument("--gpu", action="store_true", help="the real GPU and MPS, not the simulator")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs mpswrap")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    trees = [t.resolve() for t in args.trees]
    runs: dict[str, list[dict[str, float]]] = {str(t): [] for t in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            runs[str(tree)].append(measure(tree, args, r))
    summaries: list[dict[str, Any]] = []
    for tree in trees:
        mine = runs[str(tree)]
        summary = {
            "tree": str(tree),
            **tree_revision(tree),
            **{
                f"{what}_median_s": round(statistics.median(m[f"{what}_s"] for m in mine), 3)
                for what in ("status", "status_listed", "epilog")
            },
            "rounds": mine,
        }
        summaries.append(summary)
        print(json.dumps(summary))
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "host": subprocess.run(["uname", "-n"], capture_output=True, text=True).stdout.strip(),
        "simulated": not args.gpu,
        "clients": args.clients,
        **revision(),
        "trees": summaries,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
