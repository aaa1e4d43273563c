#!/usr/bin/env python3
"""tools/gpu_rehearsal: nvidia-smi's two queries the GPU tests make, answered from the MPS
simulator: ``--query-gpu`` from the simulated inventory (``MPSWRAP_GPU_INVENTORY``), and
``--query-compute-apps``: each running simulated client on the GPUs its
``CUDA_VISIBLE_DEVICES`` names, with the memory the simulator's ledger holds for it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

INVENTORY = Path(os.environ["MPSWRAP_GPU_INVENTORY"])
#: A word of a simulated client's command line (its wrapper execs ``python -m`` this).
SIMULATED = (b"mpswrap.sim.client", b"mps-sim-client")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _clients() -> list[tuple[str, list[str]]]:
    """(PID, its GPUs) of each running simulated client."""
    found = []
    first = json.loads(INVENTORY.read_text())["gpus"][0]["uuid"]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = _read(f"/proc/{pid}/cmdline").split(b"\0")
            state = _read(f"/proc/{pid}/stat").decode().rpartition(")")[2].split()[0]
            environ = _read(f"/proc/{pid}/environ").split(b"\0")
        except OSError:
            continue
        if state == "Z" or not any(w.endswith(SIMULATED) for w in words):
            continue
        env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
        cvd = env.get("CUDA_VISIBLE_DEVICES", "")
        found.append((pid, cvd.split(",") if cvd else [first]))
    return found


def _mib(gpu: str, pid: str) -> str:
    try:
        held = (Path(f"{INVENTORY}.mem") / gpu / pid).read_text().split()[0]
    except (OSError, IndexError):
        return "0"
    return str(int(held) // 2**20)


def main(args: list[str]) -> int:
    query = next((a for a in args if a.startswith("--query-")), "")
    name, _, wanted = query.partition("=")
    fields = wanted.split(",")
    if name == "--query-gpu":
        for gpu in json.loads(INVENTORY.read_text())["gpus"]:
            print(", ".join(str(gpu.get(f, "x")) for f in fields))
    elif name == "--query-compute-apps":
        for pid, gpus in _clients():
            for gpu in gpus:
                row = {"pid": pid, "gpu_uuid": gpu, "used_memory": _mib(gpu, pid)}
                print(", ".join(row.get(f, "mps-sim-client") for f in fields))
    else:
        print("nvidia-smi of tools/gpu_rehearsal: only --query-gpu and --query-compute-apps")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
