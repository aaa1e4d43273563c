"""Side-by-side benchmarks: time-sliced vs raw MPS vs mpswrap, plus mpswrap's overheads.

Resumable: every finished measurement is appended to the JSON results file at once, and a
later visit skips what is already there (so each visit to the GPU machine stays under its time
limit and later visits fill the gaps). ``--quick`` runs only the CPU overhead benchmarks
against mpswrap's MPS simulator (CI runs that).

    python benchmarks/run.py --out benchmarks/results/h100.json --phases mlp,overhead
    python benchmarks/run.py --quick --out /tmp/overhead.json
    python benchmarks/run.py --phases overhead --simulate --out benchmarks/results/cpu-sim.json

Modes: ``timesliced`` (no MPS), ``rawmps`` (daemons started by hand), ``mpswrap`` (``mpswrap
run -n N``) and, on request (``--modes``), ``mpswrap-daemon``: the daemons as mpswrap starts
them (``mpswrap start``) with the workers started plainly, no per-rank supervisor; beside
``mpswrap`` it tells the supervisors' share of any cost from the daemons'.

On a machine of several GPUs every mode runs as many workers on each GPU: those started by
hand go where ``mpswrap run`` puts its ranks, each with ``CUDA_VISIBLE_DEVICES`` naming its
GPU, and raw MPS is a daemon per GPU, as an admin runs MPS by hand on such a node.
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
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PY = sys.executable
MODES = ("timesliced", "rawmps", "mpswrap")
ALL_MODES = (*MODES, "mpswrap-daemon")
#: The worker programs (workers/protocol.py; MPS_BENCH_WORKER=stand-in runs each as the CPU
#: stand-in of the functional test).
WORKERS = HERE / "workers"


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
        # A resumed file may gather visits to several machines and commits: each run names
        # its GPU and its commit.
        stamp = {"key": key, "date": time.strftime("%Y-%m-%d")}
        stamp.update({k: self.data["meta"].get(k) for k in ("gpu_uuid", "commit", "dirty")})
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
    """The machine: Python, host, its GPUs (name and count, driver, each UUID: a run on
    several GPUs names them all, comma-separated, as ``gpu_uuid``), PyTorch."""
    meta: dict[str, Any] = {"python": sys.version.split()[0], "host": os.uname().nodename}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        rows = [[word.strip() for word in line.split(",")] for line in out.splitlines()]
        (name, meta["driver"], _), count = rows[0], len(rows)
        meta["gpu"] = name if count == 1 else f"{name} x{count}"
        meta["gpu_count"] = count
        meta["gpu_uuid"] = ",".join(row[2] for row in rows)
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        meta["gpu"] = "none"
    try:
        import torch

        meta["torch"] = torch.__version__
    except ImportError:
        pass
    return meta


# --- the GPUs, and MPS by hand ---------------------------------------------------------------
def gpu_uuids() -> list[str]:
    """The machine's GPUs in NVML order, as mpswrap sees them (the simulator's, where
    ``MPSWRAP_GPU_INVENTORY`` names its inventory)."""
    from mpswrap.config import load_settings
    from mpswrap.mps.gpu import load_inventory

    return [gpu.uuid for gpu in load_inventory(load_settings().gpu_inventory).gpus]


def worker_gpus(n: int, uuids: list[str]) -> list[str]:
    """The GPU of each of ``n`` workers started by hand: where ``mpswrap run -n N`` puts its
    ranks (block placement), so that every mode runs as many workers on each GPU."""
    from mpswrap.job.placement import plan_positions

    return [uuids[position] for position in plan_positions(n, len(uuids), "block")]


@contextmanager
def raw_mps(tmp: Path, uuid: str | None = None) -> Iterator[dict[str, str]]:
    """An MPS daemon started by hand for one GPU (the first, by default), the way the MPS
    documentation shows; what its clients need: its pipe and log directories, and
    ``CUDA_VISIBLE_DEVICES`` naming that GPU. On a machine of several GPUs a client left to
    see them all, under a daemon that serves one, fails (PyTorch asserts: gpu-lab.md)."""
    uuid = uuid or gpu_uuids()[0]
    env = dict(
        os.environ,
        CUDA_MPS_PIPE_DIRECTORY=str(tmp / "pipe"),
        CUDA_MPS_LOG_DIRECTORY=str(tmp / "log"),
        CUDA_VISIBLE_DEVICES=uuid,
    )
    for d in ("pipe", "log"):
        (tmp / d).mkdir(parents=True)
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True, timeout=30)
    try:
        yield {k: env[k] for k in (*MPS_DIRS, "CUDA_VISIBLE_DEVICES")}
    finally:
        subprocess.run(
            ["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env, timeout=60, check=False
        )


#: The variables that point a client at its daemon.
MPS_DIRS = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


@contextmanager
def raw_mps_per_gpu(tmp: Path, uuids: list[str]) -> Iterator[dict[str, dict[str, str]]]:
    """MPS by hand on a node of several GPUs, as an admin runs it: a daemon for each GPU;
    each GPU's client variables, by UUID."""
    with ExitStack() as daemons:
        yield {u: daemons.enter_context(raw_mps(tmp / f"gpu{i}", u)) for i, u in enumerate(uuids)}


@contextmanager
def mpswrap_daemon(tmp: Path, uuids: list[str]) -> Iterator[dict[str, dict[str, str]]]:
    """The daemons of these GPUs as mpswrap starts them (``mpswrap start``), and the
    variables their clients get, by UUID; no supervisor: the workers are started plainly."""
    base = [PY, "-m", "mpswrap"]
    where = ["--run-dir", str(tmp / "run"), "--job", "bench"]
    out = subprocess.run(
        [*base, "start", *where, "--gpus", ",".join(uuids)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    envs = {}
    for words in (line.split() for line in out.splitlines()):
        # "g0 <uuid> daemon <pid> user <name> cpus <list> pipe <dir>", a line per GPU
        if "pipe" in words and words[0].startswith("g"):
            pipe = Path(words[words.index("pipe") + 1])
            envs[words[1]] = {
                "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
                "CUDA_MPS_LOG_DIRECTORY": str(pipe.parent / "log"),
                "CUDA_VISIBLE_DEVICES": words[1],
            }
    try:
        yield envs
    finally:
        subprocess.run([*base, "stop", *where], capture_output=True, timeout=120, check=False)


# --- one run ----------------------------------------------------------------------------------
def _worker_argv(workload: str, tmp: Path, steps: int, weights: str | None) -> list[str]:
    argv = [
        PY,
        str(WORKERS / f"{workload}.py"),
        "--steps",
        str(steps),
        "--ready",
        str(tmp / "ready"),
        "--go",
        str(tmp / "go"),
    ]
    return argv + (["--weights", weights] if weights else [])


def _spawn(
    mode: str,
    argv: list[str],
    tmp: Path,
    gpus: list[str],
    mps_envs: dict[str, dict[str, str]],
    threads: str | None,
) -> list[subprocess.Popen[str]]:
    """The workers of a run, one on each of ``gpus`` (``mpswrap run`` places its own): each
    started by hand sees only its GPU, and under MPS gets that GPU's daemon (``mps_envs``)."""
    n = len(gpus)
    if mode == "mpswrap":
        wrap = [PY, "-m", "mpswrap", "run", "-n", str(n)]
        wrap += ["--threads", threads] if threads else []
        env = dict(os.environ, MPSWRAP_USER_RUN_DIR=str(tmp / "run"))
        return [subprocess.Popen([*wrap, "--", *argv], env=env, text=True, stdout=subprocess.PIPE)]
    if threads:
        raise ValueError(f"--threads is mpswrap's: not for mode {mode}")
    procs = []
    for i, gpu in enumerate(gpus):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu, MPSWRAP_RANK=str(i))
        if mode == "timesliced":  # make sure no default daemon is found either
            env.update(CUDA_MPS_PIPE_DIRECTORY=str(tmp / "no-mps"))
        env.update(mps_envs.get(gpu, {}))
        procs.append(subprocess.Popen(argv, env=env, text=True, stdout=subprocess.PIPE))
    return procs


def _mps_for(mode: str, tmp: Path, uuids: list[str]) -> Any:
    """The daemons a mode starts on these GPUs before its workers: by hand (``rawmps``), by
    ``mpswrap start`` (``mpswrap-daemon``) or none (time-sliced; ``mpswrap run`` starts its
    own); each GPU's client variables, by UUID."""
    if mode == "rawmps":
        return raw_mps_per_gpu(tmp, uuids)
    if mode == "mpswrap-daemon":
        return mpswrap_daemon(tmp, uuids)
    return _nothing()


def run_once(
    workload: str,
    mode: str,
    n: int,
    steps: int,
    *,
    weights: str | None = None,
    threads: str | None = None,
    label: str | None = None,
    timeout: float = 400,
) -> dict[str, Any]:
    """N workers of ``workload`` started together in ``mode``; recorded as ``label`` (the
    workload by default: the mixed set is MLP workers of several weights)."""
    tmp = Path(tempfile.mkdtemp(prefix="mpsb-", dir="/tmp"))
    (tmp / "ready").mkdir()
    gpus = worker_gpus(n, gpu_uuids())
    try:
        with _mps_for(mode, tmp, list(dict.fromkeys(gpus))) as mps_envs:
            t_spawn = time.time()
            argv = _worker_argv(workload, tmp, steps, weights)
            procs = _spawn(mode, argv, tmp, gpus, mps_envs, threads)
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
        if len(workers) != n:
            raise RuntimeError(f"{mode} n={n}: {len(workers)} workers reported")
        wall = max(w["end"] for w in workers) - t_go
        return {
            "workload": label or workload,
            "worker": workload,
            "mode": mode,
            "n": n,
            "steps": steps,
            "weights": weights,
            "threads": threads,
            "wall_s": round(wall, 4),
            "startup_s": round(t_go - t_spawn, 3),
            "throughput_steps_per_s": round(n * steps / wall, 2),
            "workers": workers,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _nothing() -> Iterator[dict[str, dict[str, str]]]:
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
def rotated(items: tuple[Any, ...], rep: int) -> tuple[Any, ...]:
    """Each repeat starts with another item, so none always runs right after the same one."""
    k = rep % len(items)
    return items[k:] + items[:k]


def phase_throughput(
    res: Results,
    workload: str,
    ns: list[int],
    steps: int,
    repeats: int,
    deadline: float,
    modes: tuple[str, ...] = MODES,
) -> bool:
    """Every mode at every N, ``repeats`` times; False when the budget ran out first."""
    for rep in range(repeats):
        for n in ns:
            for mode in rotated(modes, rep):
                key = f"{workload}/{mode}/n{n}/r{rep}"
                if res.has(key):
                    continue
                if time.monotonic() > deadline:
                    return False
                res.add(key, run_once(workload, mode, n, steps))
    return True


#: The mixed set: 2 heavy MLP workers (4x the width and the batch) and 8 light ones.
MIXED_WEIGHTS = "4:4:1:1:1:1:1:1:1:1"
#: mpswrap's ``--threads`` policies compared on it; "none" is no limit (the default).
POLICIES = ("none", "uniform", "oversubscribe", MIXED_WEIGHTS)


def mixed_variants(modes: tuple[str, ...] = MODES) -> tuple[tuple[str, str | None], ...]:
    """(mode, --threads) pairs: the plain modes, then mpswrap under each other policy."""
    plain = tuple((mode, None) for mode in modes)
    return plain + tuple(("mpswrap", p) for p in POLICIES if p != "none")


def mixed_key(mode: str, threads: str | None, n: int, rep: int) -> str:
    policy = f"-{(threads or 'none').replace(':', '-')}" if mode == "mpswrap" else ""
    return f"mixed/{mode}{policy}/n{n}/r{rep}"


def phase_mixed(
    res: Results, steps: int, repeats: int, deadline: float, modes: tuple[str, ...] = MODES
) -> bool:
    """The mixed set in each mode, and the provisioning study: mpswrap under each policy."""
    n = len(MIXED_WEIGHTS.split(":"))
    for rep in range(repeats):
        for mode, threads in rotated(mixed_variants(modes), rep):
            key = mixed_key(mode, threads, n, rep)
            if res.has(key):
                continue
            if time.monotonic() > deadline:
                return False
            weights = MIXED_WEIGHTS.replace(":", ",")
            res.add(
                key,
                run_once("mlp", mode, n, steps, weights=weights, threads=threads, label="mixed"),
            )
    return True


PHASES = ("mlp", "nbody", "provision", "overhead")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--phases", default=",".join(PHASES), help="of " + ",".join(PHASES))
    ap.add_argument("--modes", default=",".join(MODES), help="of " + ",".join(ALL_MODES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=540, help="seconds before stopping")
    ap.add_argument("--mlp-steps", type=int, default=5000, help="MLP and mixed-set steps")
    ap.add_argument("--nbody-steps", type=int, default=2000)
    ap.add_argument("--ns", default="1,4,12,24,48", help="N for mlp (nbody: those <= 12)")
    ap.add_argument("--quick", action="store_true", help="CPU overheads with the simulator")
    ap.add_argument(
        "--simulate", action="store_true", help="overhead phase against the simulator (no GPU)"
    )
    args = ap.parse_args()
    phases = args.phases.split(",")
    modes = tuple(args.modes.split(","))
    for given, known in ((phases, PHASES), (modes, ALL_MODES)):
        if set(given) - set(known):
            ap.error(f"unknown: {', '.join(sorted(set(given) - set(known)))}")
    deadline = time.monotonic() + args.budget
    sys.path.insert(0, str(HERE))
    from overhead import phase_overhead
    from revision import revision

    res = Results(args.out)
    res.data["meta"] = {**machine_meta(), **revision()}

    if args.quick:
        phase_overhead(res, simulate=True, quick=True)
        return 0
    ns = [int(n) for n in args.ns.split(",")]
    done = True
    if "mlp" in phases:
        done &= phase_throughput(res, "mlp", ns, args.mlp_steps, args.repeats, deadline, modes)
    if "nbody" in phases:
        small = [n for n in ns if n <= 12]
        done &= phase_throughput(
            res, "nbody", small, args.nbody_steps, args.repeats, deadline, modes
        )
    if "provision" in phases:
        done &= phase_mixed(res, args.mlp_steps, args.repeats, deadline, modes)
    if not done:
        print("budget reached; run again with the same --out to fill the gaps", flush=True)
    if "overhead" in phases:
        phase_overhead(res, simulate=args.simulate, quick=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
