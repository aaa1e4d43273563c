"""Small-MLP training worker (784-512-512-10, batch 64, SGD, a host sync every step).

Initialises CUDA and warms up, writes a ready file, waits for the go file, runs --steps and
prints one JSON line with its timings. Start-up is measured apart from the work.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4000)
p.add_argument("--ready", required=True)
p.add_argument("--go", required=True)
p.add_argument("--weights", default="1", help="work multipliers by rank (mixed workload)")
args = p.parse_args()
weights = [int(w) for w in args.weights.split(",")]
weight = weights[int(os.environ.get("MPSWRAP_RANK", "0")) % len(weights)]
t0 = time.time()
width = 512 * weight
model = torch.nn.Sequential(
    torch.nn.Linear(784, width),
    torch.nn.ReLU(),
    torch.nn.Linear(width, 512),
    torch.nn.ReLU(),
    torch.nn.Linear(512, 10),
).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64 * weight, 784, device="cuda")
y = torch.randint(0, 10, (64 * weight,), device="cuda")


def step() -> None:
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    torch.cuda.synchronize()


for _ in range(20):
    step()
ready = time.time()
Path(args.ready, f"{os.getpid()}").touch()
while not os.path.exists(args.go):
    time.sleep(0.002)
start = time.time()
for _ in range(args.steps):
    step()
end = time.time()
print(
    json.dumps(
        {
            "pid": os.getpid(),
            "init": ready - t0,
            "start": start,
            "end": end,
            "weight": weight,
            "threads": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        }
    ),
    flush=True,
)
sys.exit(0)
