"""The farm's cost per task, side by side with GNU parallel (and HyperQueue where its Python
package is installed) in one run, on the MPS simulator (issue 44). Not a timed test.

Two parts, each tool at the same concurrency (``-j``; the farm: ``--per-gpu`` on one
simulated GPU):

- ``true``: ``--tasks`` (500) tasks of ``true``; wall time of each tool's whole command (the
  farm's daemon start and teardown included), and its ratio to GNU parallel's (goal: at most
  2x);
- ``flat``: a farm of ``--big`` (10,000) ``true`` tasks; the farm's peak RSS (its own process,
  ``ru_maxrss`` of its children as the benchmark waits for it) against one of ``--tasks``: a
  farm's memory stays flat when the two are close.

GNU parallel: ``apt-get install -y parallel``; HyperQueue: ``pip install hyperqueue`` (its
wheel carries a local server and worker, ``hyperqueue.LocalCluster``; no ``hq`` binary comes
from a registry here), in its own venv given by ``--hq-python``. A tool that is not there is
recorded as missing.

    python benchmarks/farm_parallel.py --out /tmp/farm-parallel.json --hq-python /tmp/hq/bin/python
    python benchmarks/farm_parallel.py --quick --out F   # 50 and 200 tasks (the test suite)
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
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(HERE))
from revision import revision  # noqa: E402

from tests.simenv import finish_sim_node, make_sim_node  # noqa: E402

#: Runs a command and says, last on stderr, its wall time and its own peak RSS (its children's
#: ``ru_maxrss``, this wrapper being their only parent): one run gives both.
MEASURE = (
    "import resource, subprocess, sys, time; start = time.monotonic(); "
    "code = subprocess.run(sys.argv[1:]).returncode; took = time.monotonic() - start; "
    "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss; "
    "print(f'MEASURE {took} {rss}', file=sys.stderr); sys.exit(code)"
)


def _timed(argv: list[str], **kwargs: Any) -> tuple[float, int, int]:
    """(seconds, exit code, peak RSS in KiB) of one command."""
    res = subprocess.run(
        [sys.executable, "-c", MEASURE, *argv],
        capture_output=True,
        text=True,
        timeout=3600,
        **kwargs,
    )
    last = res.stderr.strip().splitlines()[-1].split()
    if res.returncode:
        sys.stderr.write(res.stderr[-2000:])
    return float(last[1]), res.returncode, int(last[2])


def run_farm(n: int, jobs: int, tmp: Path) -> dict[str, Any]:
    """``mpswrap farm --per-gpu JOBS`` of N ``true`` tasks on one simulated GPU."""
    node = make_sim_node(1)
    try:
        tasks = node.root / "tasks.txt"
        tasks.write_text("true\n" * n)
        argv = [sys.executable, "-m", "mpswrap", "farm", "--per-gpu", str(jobs)]
        argv += ["--progress", "off", "--dir", str(node.root / "f"), str(tasks)]
        took, code, rss = _timed(argv, env=node.env(), cwd=node.root)
    finally:
        left = finish_sim_node(node)
    return {"seconds": round(took, 3), "exit_code": code, "peak_rss_kib": rss, "left": left}


def run_parallel(n: int, jobs: int, tmp: Path) -> dict[str, Any] | None:
    binary = shutil.which("parallel")
    if binary is None:
        return None
    took, code, _ = _timed([binary, "-j", str(jobs)], input="true\n" * n)
    return {"seconds": round(took, 3), "exit_code": code}


HQ_SCRIPT = """
import sys, time
from hyperqueue import Client, Job, LocalCluster
from hyperqueue.cluster import WorkerConfig
n, jobs = int(sys.argv[1]), int(sys.argv[2])
start = time.monotonic()
with LocalCluster(worker_config=WorkerConfig(cores=jobs)) as cluster:
    client = cluster.client()
    job = Job()
    for _ in range(n):
        job.program(["true"])
    client.wait_for_jobs([client.submit(job)])
print(time.monotonic() - start)
"""


#: The interpreter that has HyperQueue's wheel (``--hq-python``; its own venv, say).
HQ_PYTHON = [sys.executable]


def run_hyperqueue(n: int, jobs: int, tmp: Path) -> dict[str, Any] | None:
    """HyperQueue's LocalCluster (its Python wheel), where installed; None where not. Its
    time includes the local server's and worker's start, as the farm's includes its daemon's."""
    python = HQ_PYTHON[0]
    probe = subprocess.run([python, "-c", "import hyperqueue"], capture_output=True, check=False)
    if probe.returncode:
        return None
    took, code, _ = _timed([python, "-c", HQ_SCRIPT, str(n), str(jobs)], cwd=tmp)
    return {"seconds": round(took, 3), "exit_code": code}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tasks", type=int, default=500)
    ap.add_argument("--big", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each tool, interleaved")
    ap.add_argument("--quick", action="store_true", help="50 and 200 tasks, one run each")
    ap.add_argument("--hq-python", default=sys.executable, help="a Python with hyperqueue")
    args = ap.parse_args()
    HQ_PYTHON[0] = args.hq_python
    small, big = (50, 200) if args.quick else (args.tasks, args.big)
    repeats = 1 if args.quick else args.repeats
    tmp = Path(tempfile.mkdtemp(prefix="farmpar-"))
    runners = {"parallel": run_parallel, "farm": run_farm, "hyperqueue": run_hyperqueue}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in runners}
    try:
        for _ in range(repeats):  # interleaved: a machine's drift falls on every tool alike
            for name, runner in runners.items():
                run = runner(small, args.jobs, tmp)
                if run is not None:
                    runs[name].append(run)
        flat = run_farm(big, args.jobs, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tools = {name: _median(found) for name, found in runs.items()}
    farm, base = runs["farm"], tools["parallel"]
    if not farm:
        raise SystemExit("farm_parallel: the farm did not run")
    data = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPUs, {os.uname().release}",
        **revision(),
        "tasks": small,
        "jobs": args.jobs,
        "repeats": repeats,
        "true": tools,
        "runs": runs,
        "farm_over_parallel": _ratio(tools["farm"], base),
        "flat": {"tasks": big, **flat, "rss_small_kib": max(r["peak_rss_kib"] for r in farm)},
    }
    args.out.write_text(json.dumps(data, indent=1))
    print(render(data))
    failed = any(r["exit_code"] or r["left"] for r in [*farm, flat])
    return 1 if failed else 0


def _ratio(farm: dict[str, Any] | None, base: dict[str, Any] | None) -> float | None:
    if not farm or not base or not base["seconds"]:
        return None
    return round(float(farm["seconds"]) / float(base["seconds"]), 2)


def _median(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run of median time (None: the tool is not installed)."""
    if not runs:
        return None
    return sorted(runs, key=lambda r: float(r["seconds"]))[len(runs) // 2]


def render(data: dict[str, Any]) -> str:
    lines = [
        f"{data['tasks']} x true at -j {data['jobs']}, median of {data['repeats']} "
        f"({data['date']}, {data['machine']}):"
    ]
    for name, run in data["true"].items():
        lines.append(f"  {name:<11} " + (f"{run['seconds']:.2f} s" if run else "not installed"))
    lines.append(f"  farm / parallel: {data['farm_over_parallel']}")
    flat = data["flat"]
    lines.append(
        f"{flat['tasks']} x true: {flat['seconds']:.1f} s, farm peak RSS {flat['peak_rss_kib']} "
        f"KiB ({data['tasks']} tasks: {flat['rss_small_kib']} KiB)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
