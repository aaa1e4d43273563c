"""nbody-style compute worker: all-pairs gravitational accelerations on the GPU (PyTorch)."""

import argparse
import json
import os
import time
from pathlib import Path

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--bodies", type=int, default=4096)
p.add_argument("--ready", required=True)
p.add_argument("--go", required=True)
args = p.parse_args()
t0 = time.time()
pos = torch.randn(args.bodies, 3, device="cuda")
vel = torch.zeros_like(pos)


def step() -> None:
    global pos, vel
    d = pos[None, :, :] - pos[:, None, :]
    inv = (d.square().sum(-1) + 1e-3).rsqrt() ** 3
    vel = vel + 1e-4 * (d * inv[..., None]).sum(1)
    pos = pos + 1e-3 * vel
    torch.cuda.synchronize()


for _ in range(5):
    step()
ready = time.time()
Path(args.ready, f"{os.getpid()}").touch()
while not os.path.exists(args.go):
    time.sleep(0.002)
start = time.time()
for _ in range(args.steps):
    step()
end = time.time()
threads = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
out = {"pid": os.getpid(), "init": ready - t0, "start": start, "end": end, "threads": threads}
print(json.dumps(out), flush=True)
