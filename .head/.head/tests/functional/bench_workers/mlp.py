"""CPU stand-in for benchmarks/workers/*.py (tests only): the same command line and protocol.

Writes its ready file, waits for the go file, then "works" as an MPS client: it runs the MPS
simulator's client (``mps-sim-client`` on PATH) for ``steps * weight`` milliseconds, and
prints the JSON line the real workers print, plus whether that client reached an MPS daemon.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100)
p.add_argument("--ready", required=True)
p.add_argument("--go", required=True)
p.add_argument("--weights", default="1")
args = p.parse_args()
weights = [int(w) for w in args.weights.split(",")]
weight = weights[int(os.environ.get("MPSWRAP_RANK", "0")) % len(weights)]
t0 = time.time()
Path(args.ready, f"{os.getpid()}").touch()
ready = time.time()
while not os.path.exists(args.go):
    time.sleep(0.002)
start = time.time()
seconds = str(args.steps * weight / 1000)
client = subprocess.run(
    ["mps-sim-client", "--seconds", seconds], capture_output=True, text=True, check=True
)
end = time.time()
record = {
    "pid": os.getpid(),
    "init": ready - t0,
    "start": start,
    "end": end,
    "weight": weight,
    "threads": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
    "mps": " mode=mps " in client.stdout,
}
print(json.dumps(record), flush=True)
sys.exit(0)
