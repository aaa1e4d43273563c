"""Side-by-side benchmarks: time-sliced vs raw MPS vs mpswrap, plus mpswrap's overheads.

Resumable: every finished measurement is appended to the JSON results file at once, and a
later visit skips what is already there (so each visit to the GPU machine stays under its time
limit and later visits fill the gaps). ``--quick`` runs only the CPU overhead benchmarks
against mpswrap's MPS simulator (CI runs that).

    python benchmarks/run.py --out benchmarks/results/h100.json --phases mlp,overhead
    python benchmarks/run.py --quick --out /tmp/overhead.json
    python benchmarks/run.py --phases overhead --simulate --out benchmarks/results/cpu-sim.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PY = sys.executable
MODES = ("timesliced", "rawmps", "mpswrap")


# --- results file -----------------------------------------------------------------------
class Results:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"runs": [], "meta": {}}
        if path.exists():
            self.data = json.loads(path.read_text())

    def has(self, key: str) -> bool:
        return any(r["key"] == key for r in self.data["runs"])

    def add(self, key: str, record: dict[str, Any]) -> None:
        # A resumed file may gather visits to several machines: each run names its GPU.
        gpu = self.data["meta"].get("gpu_uuid")
        stamp = {"key": key, "date": time.strftime("%Y-%m-%d"), "gpu_uuid": gpu}
        self.data["runs"].append({**stamp, **record})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)
        print(
            f"  {key}: {json.dumps({k: v for k, v in record.items() if k != 'workers'})}",
            flush=True,
        )


def machine_meta() -> dict[str, Any]:
    meta: dict[str, Any] = {"python": sys.version.split()[0], "host": os.uname().nodename}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        meta["gpu"], meta["driver"], meta["gpu_uuid"] = [s.strip() for s in out.split(",")][:3]
    except (OSError, ValueError, subprocess.SubprocessError):
        meta["gpu"] = "none"
    try:
        import torch

        meta["torch"] = torch.__version__
    except ImportError:
        pass
    return meta


# --- one GPU run ---------------------------------------------------------------------------
@contextmanager
def raw_mps(tmp: Path) -> Iterator[dict[str, str]]:
    """An MPS daemon started by hand, the way the MPS documentation shows."""
    env = dict(
        os.environ,
        CUDA_MPS_PIPE_DIRECTORY=str(tmp / "pipe"),
        CUDA_MPS_LOG_DIRECTORY=str(tmp / "log"),
        CUDA_VISIBLE_DEVICES="0",
    )
    for d in ("pipe", "log"):
        (tmp / d).mkdir()
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True, timeout=30)
    try:
        yield {k: env[k] for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")}
    finally:
        subprocess.run(
            ["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env, timeout=60, check=False
        )


def _worker_argv(workload: str, tmp: Path, steps: int, weights: str | None) -> list[str]:
    argv = [
        PY,
        str(HERE / "workers" / f"{workload}.py"),
        "--steps",
        str(steps),
        "--ready",
        str(tmp / "ready"),
        "--go",
        str(tmp / "go"),
    ]
    return argv + (["--weights", weights] if weights else [])


def _spawn(
    mode: str, n: int, argv: list[str], tmp: Path, mps_env: dict[str, str], threads: str | None
) -> list[subprocess.Popen[str]]:
    if mode == "mpswrap":
        wrap = [PY, "-m", "mpswrap", "run", "-n", str(n)]
        wrap += ["--threads", threads] if threads else []
        env = dict(os.environ, MPSWRAP_USER_RUN_DIR=str(tmp / "run"))
        return [subprocess.Popen([*wrap, "--", *argv], env=env, text=True, stdout=subprocess.PIPE)]
    base = dict(os.environ, **mps_env)
    if mode == "timesliced":  # make sure no default daemon is found either
        base.update(CUDA_MPS_PIPE_DIRECTORY=str(tmp / "no-mps"))
    return [
        subprocess.Popen(
            argv, env=dict(base, MPSWRAP_RANK=str(i)), text=True, stdout=subprocess.PIPE
        )
        for i in range(n)
    ]


def run_once(
    workload: str,
    mode: str,
    n: int,
    steps: int,
    *,
    weights: str | None = None,
    threads: str | None = None,
    timeout: float = 400,
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="mpsb-", dir="/tmp"))
    (tmp / "ready").mkdir()
    try:
        with raw_mps(tmp) if mode == "rawmps" else _nothing() as mps_env:
            t_spawn = time.time()
            procs = _spawn(
                mode, n, _worker_argv(workload, tmp, steps, weights), tmp, mps_env, threads
            )
            _wait(lambda: len(os.listdir(tmp / "ready")) >= n, timeout, procs)
            t_go = time.time()
            (tmp / "go").touch()
            outs = [p.communicate(timeout=timeout)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError(f"{mode} n={n}: exit codes {[p.returncode for p in procs]}")
        workers = [
            json.loads(line.split("] ", 1)[-1])
            for out in outs
            for line in out.splitlines()
            if '"start"' in line
        ]
        wall = max(w["end"] for w in workers) - t_go
        return {
            "workload": workload,
            "mode": mode,
            "n": n,
            "steps": steps,
            "threads": threads,
            "wall_s": round(wall, 4),
            "startup_s": round(t_go - t_spawn, 3),
            "throughput_steps_per_s": round(n * steps / wall, 2),
            "workers": workers,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _nothing() -> Iterator[dict[str, str]]:
    yield {}


def _wait(cond: Any, timeout: float, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
            for p in procs:
                p.kill()
            raise RuntimeError("workers did not become ready")
        time.sleep(0.01)


# --- phases -------------------------------------------------------------------------------
def phase_throughput(
    res: Results, workload: str, ns: list[int], steps: int, repeats: int, deadline: float
) -> None:
    for rep in range(repeats):
        # Each repeat starts with another mode, so no mode always runs right after another.
        order = MODES[rep % len(MODES) :] + MODES[: rep % len(MODES)]
        for n in ns:
            for mode in order:
                key = f"{workload}/{mode}/n{n}/r{rep}"
                if res.has(key):
                    continue
                if time.monotonic() > deadline:
                    print("budget reached; run again to fill the gaps", flush=True)
                    return
                res.add(key, run_once(workload, mode, n, steps))


MIXED_WEIGHTS = "4:4:1:1:1:1:1:1:1:1"
POLICIES = ("none", "uniform", "oversubscribe", MIXED_WEIGHTS)


def phase_provision(res: Results, steps: int, repeats: int, deadline: float) -> None:
    n = len(MIXED_WEIGHTS.split(":"))
    for rep in range(repeats):
        for policy in POLICIES:
            key = f"mixed/mpswrap-{policy.replace(':', '-')}/n{n}/r{rep}"
            if res.has(key) or time.monotonic() > deadline:
                continue
            res.add(
                key,
                run_once(
                    "mlp",
                    "mpswrap",
                    n,
                    steps,
                    weights=MIXED_WEIGHTS.replace(":", ","),
                    threads=None if policy == "none" else policy,
                ),
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--phases", default="mlp,nbody,provision,overhead")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=540, help="seconds before stopping")
    ap.add_argument("--mlp-steps", type=int, default=5000)
    ap.add_argument("--nbody-steps", type=int, default=2000)
    ap.add_argument("--ns", default="1,4,12,24,48")
    ap.add_argument("--quick", action="store_true", help="CPU overheads with the simulator")
    ap.add_argument(
        "--simulate", action="store_true", help="overhead phase against the simulator (no GPU)"
    )
    args = ap.parse_args()
    deadline = time.monotonic() + args.budget
    res = Results(args.out)
    res.data["meta"] = machine_meta()
    sys.path.insert(0, str(REPO))
    from overhead import phase_overhead

    if args.quick:
        phase_overhead(res, simulate=True, quick=True)
        return 0
    phases = args.phases.split(",")
    ns = [int(n) for n in args.ns.split(",")]
    if "mlp" in phases:
        phase_throughput(res, "mlp", ns, args.mlp_steps, args.repeats, deadline)
    if "nbody" in phases:
        phase_throughput(
            res, "nbody", [n for n in ns if n <= 12], args.nbody_steps, args.repeats, deadline
        )
    if "provision" in phases:
        phase_provision(res, args.mlp_steps, args.repeats, deadline)
    if "overhead" in phases:
        phase_overhead(res, simulate=args.simulate, quick=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
