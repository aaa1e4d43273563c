"""One independent small-MLP training run (784-512-512-10, batch 64, SGD, a host sync every
step), as a task of a farm: no barrier, start-up included. Prints one JSON line.

    python benchmarks/workers/mlp_task.py --steps 2000 --seed 3

``MPS_BENCH_WORKER=stand-in`` (workers/protocol.py): no torch, no GPU; the MPS simulator's
client works a millisecond a step instead (the farm benchmark's functional test).
"""

import argparse
import json
import os
import subprocess
import sys
import time

t0 = time.time()
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=2000)
p.add_argument("--seed", type=int, default=int(os.environ.get("MPSWRAP_TASK", "0")))
args = p.parse_args()
if os.environ.get("MPS_BENCH_WORKER") == "stand-in":
    seconds = str(args.steps / 1000)
    sys.exit(subprocess.run(["mps-sim-client", "--seconds", seconds], timeout=600).returncode)

import torch  # noqa: E402  (its import is part of a task's cost)

torch.manual_seed(args.seed)
model = torch.nn.Sequential(
    torch.nn.Linear(784, 512),
    torch.nn.ReLU(),
    torch.nn.Linear(512, 512),
    torch.nn.ReLU(),
    torch.nn.Linear(512, 10),
).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 784, device="cuda")
y = torch.randint(0, 10, (64,), device="cuda")
ready = time.time()
for _ in range(args.steps):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
end = time.time()
print(
    json.dumps(
        {
            "pid": os.getpid(),
            "seed": args.seed,
            "t0": t0,
            "init_s": ready - t0,
            "train_s": end - ready,
            "loss": loss.item(),
        }
    ),
    flush=True,
)
sys.exit(0)
