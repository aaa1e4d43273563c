"""Where a per-rank supervisor's start goes, up to its program's spawn: for each tree given,
``mpswrap -- true`` on the job's daemons (the prolog's), profiled from the interpreter's first
line of mpswrap to the moment it spawns the program (an audit hook on ``subprocess.Popen``
stops the profile there). Prints, per tree: the modules loaded by then, whether NVML or
psutil were among them, and the 25 functions of most cumulative time.

    python benchmarks/start_trace.py /tmp/base . [--gpu] [--python PY]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: Run by the measured interpreter: profile ``python -m mpswrap -- true`` until the spawn.
TRACED = """
import cProfile, io, pstats, runpy, sys
prof = cProfile.Profile()
def stop(event, args):
    if event == "subprocess.Popen" and prof is not None:
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
        loaded = sorted(sys.modules)
        nvml = "pynvml" in sys.modules
        ps = "psutil" in sys.modules
        print(f"TRACE modules={len(loaded)} pynvml={nvml} psutil={ps}", file=sys.stderr)
        print(out.getvalue(), file=sys.stderr)
        globals()["prof"] = None
sys.addaudithook(stop)
sys.argv = ["mpswrap", "--", "true"]
prof.enable()
runpy.run_module("mpswrap", run_name="__main__", alter_sys=True)
"""

MEASURE = """
import subprocess, sys
from pathlib import Path
sys.path[:0] = [{here!r}, {root!r}]
import overhead
overhead.REPO = Path({root!r})
overhead.compiled()
bench = overhead.Bench({simulate!r}, 1)
bench.hook("prolog", "trace")
env = dict(bench.env("trace"), SLURM_SCRIPT_CONTEXT="", SLURM_STEP_ID="0", SLURM_LOCALID="0")
env.update(SLURM_STEP_TASKS_PER_NODE="1", SLURM_TASKS_PER_NODE="1", SLURM_NTASKS="1")
try:
    out = subprocess.run([sys.executable, "-c", {traced!r}], env=env, capture_output=True,
                         text=True, timeout=120, cwd="/")
    print(out.stderr)
finally:
    bench.hook("epilog", "trace")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", type=Path)
    ap.add_argument("--gpu", action="store_true", help="the real GPU and MPS, not the simulator")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs mpswrap")
    args = ap.parse_args()
    for tree in args.trees:
        code = MEASURE.format(
            here=str(HERE), root=str(tree.resolve()), simulate=not args.gpu, traced=TRACED
        )
        print(f"=== {tree}", flush=True)
        subprocess.run([args.python, "-c", code], check=False, cwd="/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
