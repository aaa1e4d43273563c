"""mpswrap's own costs: prolog time vs GPU count, epilog time vs clients, status latency,
per-rank supervisor start and memory. With ``simulate=True`` everything runs against the MPS
simulator and a fake inventory (CI's quick mode); otherwise against the real GPU and MPS
binaries."""

from __future__ import annotations

import atexit
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
#: The job user when the benchmarks run as root: a job of uid 0 gets no MPS, as on a cluster.
BENCH_USER = "mpswbench"
#: The Slurm hooks a job's start and end cost, in the order slurmd runs them.
HOOKS = ("prolog", "epilog")


def job_user() -> tuple[int, int]:
    """(uid, gid) of the benchmark's jobs: the caller's own, or as root an unprivileged user
    made for them (``BENCH_USER``)."""
    import pwd

    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    try:
        entry = pwd.getpwnam(BENCH_USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", BENCH_USER], check=True, timeout=60)
        entry = pwd.getpwnam(BENCH_USER)
    return entry.pw_uid, entry.pw_gid


def as_job_user() -> dict[str, Any]:
    """``subprocess`` arguments that run a process as the job user (nothing when that is us)."""
    uid, gid = job_user()
    return {} if uid == os.geteuid() else {"user": uid, "group": gid, "extra_groups": []}


def compiled() -> None:
    """Bytecode for every mpswrap module, as an installed package has (pip compiles it): run
    from a checkout under PYTHONDONTWRITEBYTECODE, each start would compile them again and
    the figures would time the compiler (about 10 ms and 5 MiB more per start here)."""
    import compileall

    compileall.compile_dir(str(REPO / "mpswrap"), quiet=1)


def _timed(argv: list[str], env: dict[str, str]) -> float:
    # cwd "/": ``-m mpswrap`` must find the package through PYTHONPATH, as every call here does.
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd="/")
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{argv[-1]} failed: {res.stderr.strip()[-500:]}")
    return took


class Bench:
    """A throw-away admin config, fake Slurm environment and (simulated) GPUs."""

    def __init__(self, simulate: bool, gpus: int) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="mpso-", dir="/tmp"))
        self.tmp.chmod(0o755)  # the job user's daemon reaches its directories through it
        self.uid, self.gid = job_user()
        # Gone with the process that made it (its jobs' epilogs have run by then).
        atexit.register(shutil.rmtree, self.tmp, ignore_errors=True)
        self.simulate = simulate
        lines = [f"run_dir = {self.tmp / 'run'}", "prolog_mode = always", "syslog = no"]
        if simulate:
            from mpswrap.sim import install_bin
            from mpswrap.sim.inventory import write_inventory

            install_bin(self.tmp / "bin")
            write_inventory(self.tmp / "gpus.json", n_gpus=gpus)
            lines += [
                f"control_binary = {self.tmp / 'bin' / 'nvidia-cuda-mps-control'}",
                f"gpu_inventory = {self.tmp / 'gpus.json'}",
            ]
            self.client = [str(self.tmp / "bin" / "mps-sim-client"), "--seconds", "120"]
        else:
            self.client = [os.environ.get("MPS_CONTRACT_CLIENT", "cuda_client"), "--seconds", "120"]
        (self.tmp / "mpswrap.conf").write_text("\n".join(lines) + "\n")
        self.gpus = gpus

    def env(self, job: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MPSWRAP"))}
        env.update(
            MPSWRAP_CONFIG=str(self.tmp / "mpswrap.conf"),
            SLURM_JOB_ID=job,
            SLURM_JOB_UID=str(self.uid),
            SLURM_JOB_GID=str(self.gid),
            SLURMD_NODENAME="bench",
            SLURM_JOB_GPUS=f"0-{self.gpus - 1}",
            SLURM_SCRIPT_CONTEXT="prolog_slurmd",
            PYTHONPATH=str(REPO),
        )
        return env

    def hook(self, name: str, job: str) -> float:
        # The installed shims use ``python -I``; here the repository is on PYTHONPATH instead.
        return _timed([PY, "-m", "mpswrap", name], self.env(job))

    def hooks(self, job: str) -> dict[str, float]:
        """A job of this many GPUs, no clients: its prolog, then its epilog, timed (s)."""
        return {hook: self.hook(hook, job) for hook in HOOKS}

    def attach_clients(self, job: str, k: int, said: bool = False) -> list[subprocess.Popen[bytes]]:
        """K test clients of the job's GPU as its user; ``said``: their stdout a pipe, for
        ``wait_started``."""
        job_dir = self.tmp / "run" / "bench" / job / "g0"
        env = dict(
            self.env(job),
            CUDA_MPS_PIPE_DIRECTORY=str(job_dir / "pipe"),
            CUDA_MPS_LOG_DIRECTORY=str(job_dir / "log"),
        )
        return [
            subprocess.Popen(
                self.client,
                env=env,
                stdout=subprocess.PIPE if said else subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                **as_job_user(),
            )
            for _ in range(k)
        ]


def wait_started(clients: list[subprocess.Popen[bytes]], timeout: float = 120) -> None:
    """Until each client (``attach_clients(said=True)``) has said "started": its CUDA context
    is up and its first allocation made. A client is listed by its server before that."""
    deadline = time.monotonic() + timeout
    for client in clients:
        assert client.stdout is not None
        ready, _, _ = select.select([client.stdout], [], [], max(0, deadline - time.monotonic()))
        line = client.stdout.readline() if ready else b""  # flushed; EOF if one died
        if b" started" not in line:
            raise RuntimeError(f"client {client.pid} did not start in {timeout:g} s: {line!r}")


def _median(values: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(values) * 1000, 1),
        "min_ms": round(min(values) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
    }


def _wait_listed(bench: Bench, job: str, k: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        out = subprocess.run(
            [PY, "-m", "mpswrap", "status", "--json"],
            env=dict(bench.env(job), SLURM_SCRIPT_CONTEXT=""),
            capture_output=True,
            text=True,
            cwd="/",
        ).stdout
        if out.count('"cmdline"') >= k:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{k} clients did not attach")


def phase_overhead(res: Any, *, simulate: bool, quick: bool) -> None:
    kind = "sim" if simulate else "gpu"
    compiled()
    gpu_counts = [1, 2, 4, 8] if simulate else [1]
    repeats = 3
    for g in gpu_counts:
        key = f"overhead/{kind}/prolog/gpus{g}"
        if res.has(key):
            continue
        bench = Bench(simulate, g)
        rounds = [bench.hooks(f"p{g}r{r}") for r in range(repeats)]
        pro, epi = ([t[hook] for t in rounds] for hook in HOOKS)
        res.add(
            key,
            {
                "what": "prolog",
                "gpus": g,
                "prolog": _median(pro),
                "epilog_no_clients": _median(epi),
                "simulated": simulate,
            },
        )
    key = f"overhead/{kind}/supervisor"
    if not res.has(key):
        res.add(key, _supervisor_costs(Bench(simulate, 1), "sup", 5 if quick else 11))
    for k in [0, 12] if quick else [0, 12, 48]:
        key = f"overhead/{kind}/epilog/clients{k}"
        if res.has(key):
            continue
        bench = Bench(simulate, 1)
        times, status = [], []
        for r in range(repeats if k < 48 else 1):
            job = f"e{k}r{r}"
            bench.hook("prolog", job)
            clients = bench.attach_clients(job, k)
            if k:
                _wait_listed(bench, job, k)
            t0 = time.perf_counter()
            subprocess.run(
                [PY, "-m", "mpswrap", "status", "--json"],
                env=dict(bench.env(job), SLURM_SCRIPT_CONTEXT=""),
                capture_output=True,
                check=True,
                cwd="/",
            )
            status.append(time.perf_counter() - t0)
            times.append(bench.hook("epilog", job))
            for c in clients:
                c.wait(timeout=60)
        res.add(
            key,
            {
                "what": "epilog",
                "clients": k,
                "epilog": _median(times),
                "status": _median(status),
                "simulated": simulate,
            },
        )


def _rss_of(me: Any, rss: list[int], guard_rss: list[int], guard_uss: list[int]) -> None:
    """The supervisor's RSS and its guard's (the child whose command line is the supervisor's:
    a fork; not a short-lived control client it runs, which may end while we look)."""
    import psutil

    rss.append(me.memory_info().rss)
    for kid in me.children():
        try:
            if kid.cmdline() == me.cmdline():
                guard_rss.append(kid.memory_info().rss)
                guard_uss.append(kid.memory_full_info().uss)
        except psutil.NoSuchProcess:  # also a zombie
            continue


def _supervisor_costs(bench: Bench, job: str, repeats: int) -> dict[str, Any]:
    """Per-rank supervisor (``mpswrap -- prog``) with the job's daemons running: time from
    its exec to the program's exec, and resident memory of the supervisor and of its guard."""
    import psutil

    bench.hook("prolog", job)
    env = dict(bench.env(job), SLURM_SCRIPT_CONTEXT="", SLURM_STEP_ID="0", SLURM_LOCALID="0")
    env.update(SLURM_STEP_TASKS_PER_NODE="1", SLURM_TASKS_PER_NODE="1", SLURM_NTASKS="1")
    start: list[float] = []
    rss: list[int] = []
    guard_rss: list[int] = []
    guard_uss: list[int] = []
    proc: subprocess.Popen[bytes] | None = None
    try:
        for _ in range(repeats):
            t0 = time.time()
            out = subprocess.run(
                [PY, "-m", "mpswrap", "--", "date", "+%s.%N"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
                cwd="/",
                **as_job_user(),
            )
            start.append(float(out.stdout) - t0)
        for _ in range(3):
            proc = subprocess.Popen(
                [PY, "-m", "mpswrap", "--", "sleep", "2"], env=env, cwd="/", **as_job_user()
            )
            time.sleep(1.2)
            _rss_of(psutil.Process(proc.pid), rss, guard_rss, guard_uss)
            proc.wait(timeout=60)
    finally:
        if proc is not None and proc.poll() is None:  # a failed measurement: no leftover
            proc.kill()
            proc.wait()
        bench.hook("epilog", job)
    mib = 2**20
    return {
        "what": "supervisor",
        "start": _median(start),
        "rss_mib": round(statistics.median(rss) / mib, 1),
        "guard_rss_mib": round(statistics.median(guard_rss) / mib, 1) if guard_rss else None,
        "guard_uss_mib": round(statistics.median(guard_uss) / mib, 1) if guard_uss else None,
        "simulated": bench.simulate,
    }
