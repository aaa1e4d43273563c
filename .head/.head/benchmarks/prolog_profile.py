"""Where one prolog's time goes: the prolog (one GPU) under cProfile and under
``-X importtime``, against the real GPU or the simulator, with the epilog after each.

    python benchmarks/prolog_profile.py [--simulate] [--top 25]

Prints the wall time of each run, the heaviest cumulative functions, and the heaviest
imports. The hook runs as in overhead.py's Bench (admin config, fake Slurm job variables).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import PY, Bench, compiled


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    took = time.perf_counter() - start
    if res.returncode != 0:
        sys.exit(f"failed ({res.returncode}): {' '.join(argv)}\n{res.stderr[-2000:]}")
    return took, res.stdout + res.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simulate", action="store_true", help="the MPS simulator, no GPU")
    ap.add_argument("--top", type=int, default=25, help="functions and imports to show")
    args = ap.parse_args()
    compiled()
    bench = Bench(args.simulate, 1)
    plain = [bench.hook("prolog", f"warm{i}") for i in range(3)]
    for i in range(3):
        bench.hook("epilog", f"warm{i}")
    print(f"prolog wall, plain: {', '.join(f'{t * 1000:.0f} ms' for t in plain)}")
    with tempfile.TemporaryDirectory() as tmp:
        stats = os.path.join(tmp, "prolog.prof")
        env = bench.env("prof")
        took, _ = _run([PY, "-m", "cProfile", "-o", stats, "-m", "mpswrap", "prolog"], env)
        bench.hook("epilog", "prof")
        print(f"prolog wall under cProfile: {took * 1000:.0f} ms; cumulative, heaviest:")
        import pstats

        pstats.Stats(stats).sort_stats("cumulative").print_stats(args.top)
    took, out = _run([PY, "-X", "importtime", "-m", "mpswrap", "prolog"], bench.env("imp"))
    bench.hook("epilog", "imp")
    rows = []
    for line in out.splitlines():
        found = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if found:
            rows.append((int(found[2]), found[4]))
    print(f"prolog wall under -X importtime: {took * 1000:.0f} ms; imports, heaviest (us):")
    for cum, name in sorted(rows, reverse=True)[: args.top]:
        print(f"  {cum:8d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
