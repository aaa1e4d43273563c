"""One memory-heavy task of a farm: it holds ``--gib`` GiB of GPU memory (``torch.empty`` on
CUDA, every byte written once, so the memory is really in use) for ``--seconds`` while a small
kernel runs over a slice of it; start-up included. Prints one JSON line.

When the GPU has no room, PyTorch raises its own out-of-memory error ("CUDA out of memory",
``torch.OutOfMemoryError``) and the task exits 1 with the traceback on stderr, as a user's
task would: that is what the farm has to recognise.

    python benchmarks/workers/mem_task.py --gib 24 --seconds 3

``MPS_BENCH_WORKER=stand-in`` (workers/protocol.py): no torch, no GPU; the MPS simulator's
client holds ``--alloc-mib`` for the same time instead.
"""

import argparse
import json
import os
import subprocess
import sys
import time

t0 = time.time()
p = argparse.ArgumentParser()
p.add_argument("--gib", type=float, default=24.0)
p.add_argument("--seconds", type=float, default=3.0)
args = p.parse_args()
if os.environ.get("MPS_BENCH_WORKER") == "stand-in":
    sim = ["mps-sim-client", "--seconds", str(args.seconds), "--alloc-mib", str(args.gib * 1024)]
    sys.exit(subprocess.run(sim, timeout=600).returncode)

import torch  # noqa: E402  (its import is part of a task's cost)

held = torch.empty(int(args.gib * 2**30), dtype=torch.uint8, device="cuda")
held.fill_(1)
torch.cuda.synchronize()
ready = time.time()
window = held[: 2**26]  # 64 MiB: a small kernel, so the task is a busy GPU client
while time.time() - ready < args.seconds:
    window.add_(1)
    torch.cuda.synchronize()
end = time.time()
print(
    json.dumps(
        {
            "pid": os.getpid(),
            "gib": args.gib,
            "t0": t0,
            "init_s": ready - t0,
            "held_s": end - ready,
            "peak_bytes": torch.cuda.max_memory_allocated(),
        }
    ),
    flush=True,
)
sys.exit(0)
