"""What every throughput worker shares with benchmarks/run.py: the command line, the start
handshake and the JSON line.

A worker starts up (CUDA, its model, a warm-up: timed as ``init``), creates a file named by
its PID in the ``--ready`` directory, waits for the ``--go`` file (run.py creates it once
every worker is ready, so all time the same contention), runs ``--steps`` steps and prints
one JSON line: ``pid``, ``init``, ``start``, ``end``, its ``weight`` if it has one,
``threads`` (its MPS thread share), ``gpu`` (its ``CUDA_VISIBLE_DEVICES``: the GPU it was
given, on a machine of several).

``MPS_BENCH_WORKER=stand-in`` (tests/functional/test_benchmarks.py): the same protocol
without a GPU or torch. The work is the MPS simulator's client (``mps-sim-client`` on PATH)
for a millisecond per step and unit of weight, and the line adds ``mps``: whether that
client reached an MPS daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Runs that many steps of a worker's workload, to their end on the GPU.
Steps = Callable[[int], None]
#: The value of MPS_BENCH_WORKER that selects the CPU stand-in.
STAND_IN = "stand-in"


def standing_in() -> bool:
    """Whether this worker is the CPU stand-in (then it must not import torch)."""
    return os.environ.get("MPS_BENCH_WORKER") == STAND_IN


def parser(steps: int, *, weighted: bool = False) -> argparse.ArgumentParser:
    """The options run.py passes every worker; ``weighted``: also ``--weights``."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--ready", required=True)
    p.add_argument("--go", required=True)
    if weighted:
        p.add_argument("--weights", default="1", help="work multipliers by rank (mixed workload)")
    return p


def weight(weights: str) -> int:
    """This rank's work multiplier: MPSWRAP_RANK picks one of the comma-separated ``weights``."""
    choices = [int(w) for w in weights.split(",")]
    return choices[int(os.environ.get("MPSWRAP_RANK", "0")) % len(choices)]


def serve(
    args: argparse.Namespace,
    build: Callable[[], Steps],
    *,
    warmup: int,
    weight: int | None = None,
) -> int:
    """The protocol around one worker: ``build()`` (CUDA and the model) and ``warmup`` steps,
    the handshake, ``args.steps`` timed steps, the JSON line; the exit code."""
    t0 = time.time()
    stand_in = _StandIn(weight or 1) if standing_in() else None
    run = stand_in or build()
    if stand_in is None:
        run(warmup)
    ready = time.time()
    Path(args.ready, f"{os.getpid()}").touch()
    while not os.path.exists(args.go):
        time.sleep(0.002)
    start = time.time()
    run(args.steps)
    end = time.time()
    record: dict[str, Any] = {"pid": os.getpid(), "init": ready - t0, "start": start, "end": end}
    if weight is not None:
        record["weight"] = weight
    record["threads"] = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    record["gpu"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    if stand_in is not None:
        record["mps"] = stand_in.mps
    print(json.dumps(record), flush=True)
    return 0


class _StandIn:
    """The CPU stand-in's work: the simulated CUDA client for ``steps * weight`` ms."""

    def __init__(self, weight: int) -> None:
        self.weight = weight
        self.mps = False

    def __call__(self, steps: int) -> None:
        seconds = str(steps * self.weight / 1000)
        client = subprocess.run(
            ["mps-sim-client", "--seconds", seconds],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        if client.returncode != 0:  # what the simulated CUDA call said, with the failure
            raise RuntimeError(
                f"mps-sim-client exited {client.returncode}: {client.stdout}{client.stderr}"
            )
        self.mps = " mode=mps " in client.stdout
