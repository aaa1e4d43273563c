"""Supervisor start and memory, prolog and epilog time of two mpswrap trees, side by side.

    git worktree add /tmp/base <commit>
    python benchmarks/startup_ab.py /tmp/base . --rounds 4 --out benchmarks/results/<file>.json
    python benchmarks/startup_ab.py /tmp/base . --gpu --python /opt/mpswrap-venv/bin/python

Each round measures both trees, one after the other (the order alternates), against the MPS
simulator (``--gpu``: the real GPU and MPS), with this checkout's ``overhead.py`` pointed at the
tree's mpswrap: ``mpswrap -- date`` with the job's daemons up, from exec to the program's exec,
and the RSS of the supervisor and of its guard; the prolog and the epilog of a one-GPU job with
no clients. ``--python``: the interpreter that runs mpswrap, e.g. a venv holding only its
dependencies, as an admin installs it (default: this one). The trees' bytecode is compiled
first. Medians over the rounds.
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
import json, sys
from pathlib import Path
sys.path[:0] = [{here!r}, {root!r}]
import overhead
overhead.REPO = Path({root!r})
overhead.compiled()
out = overhead._supervisor_costs(overhead.Bench({simulate!r}, 1), "ab", {repeats})
for gpus in {gpus!r}:
    bench = overhead.Bench({simulate!r}, gpus)
    rounds = [bench.hooks(f"h{{r}}") for r in range({repeats})]
    out[f"hooks{{gpus}}"] = {{
        hook: overhead._median([t[hook] for t in rounds]) for hook in overhead.HOOKS
    }}
print(json.dumps(out))
"""


def _name(hook: str, gpus: int) -> str:
    """``prolog_median_ms`` for one GPU, ``prolog_gpus8_median_ms`` for eight."""
    return f"{hook}_median_ms" if gpus == 1 else f"{hook}_gpus{gpus}_median_ms"


def measure(root: Path, args: argparse.Namespace, gpus: list[int]) -> dict[str, Any]:
    code = MEASURE.format(
        here=str(HERE), root=str(root), repeats=args.repeats, gpus=gpus, simulate=not args.gpu
    )
    out = subprocess.run(
        [args.python, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs=2, type=Path, help="two checkouts: base, then changed")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7, help="starts per measurement")
    ap.add_argument("--gpus", default="1", help="GPU counts for the hooks, e.g. 1,8")
    ap.add_argument("--gpu", action="store_true", help="the real GPU and MPS, not the simulator")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs mpswrap")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    trees = [t.resolve() for t in args.trees]
    gpus = [int(g) for g in args.gpus.split(",")]
    if 1 not in gpus:
        ap.error("--gpus must include 1")
    runs: dict[str, list[dict[str, Any]]] = {str(t): [] for t in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            runs[str(tree)].append(measure(tree, args, gpus))
    summaries: list[dict[str, Any]] = []
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "python": subprocess.run(
            [args.python, "-c", "import sys; print(sys.version.split()[0])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip(),
        "interpreter": args.python,
        "simulated": not args.gpu,
        "host": subprocess.run(["uname", "-n"], capture_output=True, text=True).stdout.strip(),
        "rounds": args.rounds,
        "repeats": args.repeats,
        **revision(),  # this checkout's, whose measuring code ran
        "trees": summaries,
    }
    for tree in trees:
        mine = runs[str(tree)]
        starts = [m["start"]["median_ms"] for m in mine]
        summary = {
            "tree": str(tree),
            **tree_revision(tree),
            "start_median_ms": round(statistics.median(starts), 1),
            "start_round_medians_ms": starts,
            **{
                _name(hook, g): round(
                    statistics.median(m[f"hooks{g}"][hook]["median_ms"] for m in mine), 1
                )
                for g in gpus
                for hook in ("prolog", "epilog")
            },
            "rss_mib": statistics.median(m["rss_mib"] for m in mine),
            "guard_rss_mib": round(statistics.median(m["guard_rss_mib"] or 0 for m in mine), 2),
            "guard_uss_mib": statistics.median(m["guard_uss_mib"] or 0 for m in mine),
        }
        summaries.append(summary)
        print(json.dumps(summary))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
