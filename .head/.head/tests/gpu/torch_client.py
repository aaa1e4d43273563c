"""A small PyTorch MPS client: train a tiny MLP for --seconds, report CUDA errors, exit 1."""

import argparse
import os
import sys
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=20.0)
args = parser.parse_args()
try:
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 784, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    print(f"torch-client {os.getpid()} started on {torch.cuda.get_device_name()}", flush=True)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        torch.cuda.synchronize()
    print(f"torch-client {os.getpid()} done", flush=True)
except Exception as exc:  # the sticky MPS error after terminate_client lands here
    print(f"torch-client {os.getpid()} CUDA error: {exc}", flush=True)
    sys.exit(1)
