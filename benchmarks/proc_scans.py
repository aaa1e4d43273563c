"""What finding a run's processes costs on a machine of many processes: mpswrap's readings of
the process table against psutil's, side by side in each round.

    python benchmarks/proc_scans.py --extra 1500 --rounds 5 --out benchmarks/results/<file>.json

Starts ``--extra`` sleeping processes (a large node's kernel threads and services stand in for
them) and 48 ranks, each a sleeping process with a child, whose environment names a pipe
directory. Then, each round, both ways of each question:
- ``trees``: every rank's descendants. psutil's ``children(recursive=True)`` one rank at a
  time (a run's teardown and attach checks did this), against one reading of the table for all
  of them (``_proc.descendants``);
- ``env``: this user's processes that name the pipe directory. psutil's ``process_iter`` with
  each one's uids, environment and status (the scan a teardown made once per GPU), against
  ``_proc.procs_with_env`` (the owner of each ``/proc`` entry, then one read of the
  environments of those).
Both ways must find the same processes. Medians and ranges over the rounds, in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from revision import REPO, revision

sys.path.insert(0, str(REPO))
from mpswrap import _proc

RANKS = 48
PIPE_VAR = "CUDA_MPS_PIPE_DIRECTORY"
#: A rank: a sleeping process with a sleeping child.
RANK = "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"


def _psutil_trees(pids: list[int]) -> dict[int, set[int]]:
    return {pid: {c.pid for c in psutil.Process(pid).children(recursive=True)} for pid in pids}


def _own_trees(pids: list[int]) -> dict[int, set[int]]:
    return {pid: {p.pid for p in kids} for pid, kids in _proc.descendants(pids).items()}


def _psutil_env(pipe: str) -> set[int]:
    found = set()
    for proc in psutil.process_iter(["pid", "uids"]):
        if not proc.info["uids"] or proc.info["uids"].real != os.geteuid():
            continue
        try:
            if proc.environ().get(PIPE_VAR) == pipe and proc.status() != psutil.STATUS_ZOMBIE:
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


def _own_env(pipe: str) -> set[int]:
    return {p.pid for p, env in _proc.procs_with_env(PIPE_VAR) if env[PIPE_VAR] == pipe}


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = call()
    return (time.perf_counter() - start) * 1000, out


def _spawn(extra: int, pipe: str) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    others = [subprocess.Popen(["sleep", "600"]) for _ in range(extra)]
    env = {**os.environ, PIPE_VAR: pipe}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK], env=env) for _ in range(RANKS)]
    deadline = time.monotonic() + 120
    while not all(psutil.Process(r.pid).children() for r in ranks):
        if time.monotonic() > deadline:
            raise SystemExit("the ranks' children did not start in 120 s")
        time.sleep(0.1)
    return others + ranks, [r.pid for r in ranks]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--extra", type=int, default=1500, help="other processes (default 1500)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, help="the results file (default: print only)")
    args = ap.parse_args()
    pipe = f"/tmp/proc-scans-{os.getpid()}/pipe"
    started, ranks = _spawn(args.extra, pipe)
    try:
        runs: list[dict[str, Any]] = []
        for rnd in range(args.rounds):
            ms = {}
            ms["trees_psutil"], before = _timed(lambda: _psutil_trees(ranks))
            ms["trees_own"], after = _timed(lambda: _own_trees(ranks))
            assert before == after
            assert all(len(kids) == 1 for kids in after.values())
            ms["env_psutil"], before = _timed(lambda: _psutil_env(pipe))
            ms["env_own"], after = _timed(lambda: _own_env(pipe))
            assert before == after
            assert len(after) == 2 * RANKS, len(after)
            runs.append({"round": rnd, **{k: round(v, 1) for k, v in ms.items()}})
            print(json.dumps(runs[-1]), flush=True)
        processes = len(psutil.pids())
    finally:
        for rank in ranks:  # the ranks' children first: orphaned, they would be no one's
            for child in psutil.Process(rank).children():
                child.kill()
        for proc in started:
            proc.kill()
        for proc in started:
            proc.wait()
    meta = {
        **revision(),
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "processes": processes,
        "ranks": RANKS,
        "extra": args.extra,
        "python": sys.version.split()[0],
        "psutil": psutil.__version__,
    }
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "round"}
    print(json.dumps({"meta": meta, "medians_ms": medians}))
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
