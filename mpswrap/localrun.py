"""Local ranks: where each goes (shared with the per-rank mode) and ``mpswrap run -n N``.

``place()`` turns a local rank into its GPU, its daemon and its client environment (threads,
memory limit, priority). ``run_local()`` is ``mpswrap run -n N -- cmd``: no MPI, no scheduler;
this process is the one owner of the attachment, starts N shielded children with
``MPSWRAP_RANK``/``MPSWRAP_LOCAL_RANK``/``MPSWRAP_NPROCS``/``MPSWRAP_LOCAL_SIZE``, prefixes each
line of their output with ``[rank] ``, and ends the others through the ladder when one fails
(exit code: the first failing rank's) or when a signal arrives (128+signal).
"""

from __future__ import annotations

import logging
import os
import select
import shlex
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from . import _proc
from .client import check_capacity, choose_gpu, client_env, plan_positions, provision_threads
from .config import Settings
from .daemon import Daemon
from .errors import UsageError
from .gpu import GpuInfo, client_limit, load_inventory
from .jobenv import JobEnv
from .node import JobDaemons, user_layout
from .owner import Attachment, attach, job_id_of, release, visible_gpus
from .paths import JobLayout
from .supervisor import (
    FORWARDED,
    TERMINATING,
    VERIFY_FAILED,
    Rank,
    SignalTrap,
    Verifier,
    end_ranks,
    exit_code,
    guarded,
    spawn_rank,
    verifiers,
)

__all__ = [
    "Placement",
    "RankOptions",
    "check_gpus",
    "place",
    "print_rank",
    "rank_capacity",
    "run_local",
]

log = logging.getLogger(__name__)

#: How long output of ranks that exited may still arrive (a daemonised grandchild can hold
#: the pipe open forever).
DRAIN_TIMEOUT = 5.0


@dataclass(frozen=True)
class RankOptions:
    """The wrapper options that shape one rank."""

    policy: str = "block"
    threads: str | None = None
    mem_limit: str | None = None
    priority: int | None = None
    verify_attach: str | None = None
    verify_timeout: float = 30.0
    shield: bool = True
    grace: float = 10.0


@dataclass(frozen=True)
class Placement:
    """One local rank's GPU and client environment."""

    position: int
    key: str
    uuid: str
    env: dict[str, str]
    daemon: Daemon
    lock: Path


def place(
    layout: JobLayout,
    gpus: Sequence[tuple[str, str]],
    settings: Settings,
    *,
    local_rank: int,
    local_size: int,
    opts: RankOptions,
) -> Placement:
    """GPU and environment of ``local_rank``; ``gpus`` are (key, UUID) pairs in order."""
    policy = opts.policy
    rank_cpus = gpu_cpus = None
    if policy == "affinity":
        inventory = load_inventory(settings.gpu_inventory)
        gpu_cpus = [inventory.by_uuid(uuid).cpus for _, uuid in gpus]
        rank_cpus = JobEnv({}).cpus_allowed
    position = choose_gpu(
        local_rank, local_size, len(gpus), policy=policy, rank_cpus=rank_cpus, gpu_cpus=gpu_cpus
    )
    plan = plan_positions(local_size, len(gpus), policy)
    sharing = plan.count(position) or 1
    index = sum(1 for r in range(min(local_rank, len(plan))) if plan[r] == position)
    key, uuid = gpus[position]
    daemon = JobDaemons(layout, settings).daemon(key)
    env = client_env(
        daemon.dirs,
        uuid,
        threads=provision_threads(opts.threads, sharing, index),
        mem_limit=_mem_limit(opts.mem_limit, settings, uuid, sharing),
        priority=opts.priority,
    )
    return Placement(position, key, uuid, env, daemon, layout.ranks_lock_path(key))


def _mem_limit(spec: str | None, settings: Settings, uuid: str, sharing: int) -> str | None:
    """``auto``: the GPU's memory shared equally by the ranks on it; else a size as given."""
    if spec != "auto":
        return spec
    total = load_inventory(settings.gpu_inventory).by_uuid(uuid).memory_total
    if total <= 0:
        raise UsageError(
            "--mem-limit auto needs the GPU's memory size",
            thing=uuid,
            cause="the inventory does not say",
            hint="give a size, e.g. 8G",
        )
    return f"{max(1, total // sharing // 2**20)}M"


def gpus_of(att: Attachment) -> list[tuple[str, str]]:
    return [(m.key, m.gpu_uuid) for m in att.manifests]


def planned_gpus(
    settings: Settings, env: JobEnv, gpus: list[GpuInfo] | None = None
) -> tuple[JobLayout, list[tuple[str, str]]]:
    """What ``attach`` would use, without starting anything (``--dry-run``)."""
    job, node = job_id_of(env), env.node
    admin = JobDaemons(JobLayout(Path(settings.run_dir), node, job), settings)
    manifests = admin.manifests() if admin.layout.job_dir.exists() else []
    if manifests:
        return admin.layout, [(m.key, m.gpu_uuid) for m in manifests]
    chosen = gpus if gpus is not None else visible_gpus(env, settings)
    return user_layout(settings, node, job), [(f"g{i}", g.uuid) for i, g in enumerate(chosen)]


def check_gpus(gpus: Sequence[GpuInfo], ranks: int, settings: Settings,
               env: Mapping[str, str], policy: str) -> None:  # fmt: skip
    """CapacityError when ``ranks`` local ranks would give a GPU more clients than it takes."""
    driver = load_inventory(settings.gpu_inventory).cuda_driver_version
    wanted = Counter(gpus[p].uuid for p in plan_positions(ranks, len(gpus), policy))
    limits = {g.uuid: client_limit(g, driver, env, settings.client_limit) for g in gpus}
    check_capacity(wanted, limits)


def rank_capacity(att: Attachment, local_size: int, policy: str, env: Mapping[str, str]) -> None:
    """The check on the node, in user mode (the inventory is loaded already for it)."""
    if att.mode == "user" and att.manifests:
        inventory = load_inventory(att.settings.gpu_inventory)
        gpus = [inventory.by_uuid(m.gpu_uuid) for m in att.manifests]
        check_gpus(gpus, local_size, att.settings, env, policy)


# --- mpswrap run -n N ---------------------------------------------------------------------
def run_local(
    command: Sequence[str],
    nprocs: int,
    settings: Settings,
    opts: RankOptions,
    *,
    job: str | None = None,
    gpus: list[GpuInfo] | None = None,
    dry_run: bool = False,
) -> int:
    """``mpswrap run -n N -- command``; returns the exit code."""
    if nprocs < 1:
        raise UsageError("bad -n", thing=str(nprocs), cause="need at least one rank")
    if not command:
        raise UsageError("no command to run", hint="mpswrap run -n 4 -- python train.py")
    env = dict(os.environ)
    # A fresh layout per run unless told otherwise: this process is its only owner.
    job = job or env.get("MPSWRAP_JOB") or env.get("SLURM_JOB_ID") or f"run-{os.getpid()}"
    job_env = JobEnv({**env, "MPSWRAP_JOB": job})
    if dry_run:
        layout, pairs = planned_gpus(settings, job_env, gpus)
        return _print_plan(layout, pairs, settings, command=command, n=nprocs, opts=opts)
    # Signals are only recorded from here on, so that attach and release always complete.
    with SignalTrap() as trap:
        att = attach(settings, job_env, gpus=gpus)
        try:
            rank_capacity(att, nprocs, opts.policy, env)
            early = [sig for sig in trap.pop() if sig in TERMINATING]
            if early:
                return 128 + early[0]
            return _run_ranks(att, command, nprocs, opts=opts, base=env, trap=trap)
        finally:
            release(att)


def _rank_env(base: Mapping[str, str], placement: Placement, rank: int, n: int) -> dict[str, str]:
    env = {**base, **placement.env}
    env.update(
        MPSWRAP_RANK=str(rank),
        MPSWRAP_LOCAL_RANK=str(rank),
        MPSWRAP_NPROCS=str(n),
        MPSWRAP_LOCAL_SIZE=str(n),
    )
    return env


def _print_plan(
    layout: JobLayout,
    pairs: list[tuple[str, str]],
    settings: Settings,
    *,
    command: Sequence[str],
    n: int,
    opts: RankOptions,
) -> int:
    for rank in range(n):
        placement = place(layout, pairs, settings, local_rank=rank, local_size=n, opts=opts)
        print_rank(rank, placement, _rank_env({}, placement, rank, n), command)
    return 0


def print_rank(
    rank: int, placement: Placement, env: Mapping[str, str], command: Sequence[str]
) -> None:
    """``--dry-run``: one rank's GPU, environment and command, ready to paste."""
    shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    print(f"[{rank}] gpu {placement.position} ({placement.uuid}): {shown} {shlex.join(command)}")


def _run_ranks(att: Attachment, command: Sequence[str], n: int, *, opts: RankOptions,
               base: Mapping[str, str], trap: SignalTrap) -> int:  # fmt: skip
    ranks: list[Rank] = []
    pumps: list[threading.Thread] = []
    try:
        for index in range(n):
            found = place(att.layout, gpus_of(att), att.settings, local_rank=index,
                          local_size=n, opts=opts)  # fmt: skip
            rank = spawn_rank(command, _rank_env(base, found, index, n), found.daemon,
                              shield=opts.shield, name=f"rank {index}", stdout=_proc.PIPE,
                              stderr=_proc.PIPE, stdin=_proc.DEVNULL, lock=found.lock)  # fmt: skip
            ranks.append(rank)
        with guarded(ranks, opts.grace):  # forked before the output threads start
            for index, rank in enumerate(ranks):
                pumps += _start_pumps(rank, index)
            checks = verifiers(ranks, opts.verify_attach, opts.verify_timeout)
            return _wait_ranks(ranks, trap, opts.grace, checks)
    except BaseException:
        end_ranks(ranks, signal.SIGTERM, opts.grace)  # an error of ours: end them cleanly
        raise
    finally:
        _join(pumps)


def _wait_ranks(ranks: list[Rank], trap: SignalTrap, grace: float,
                checks: list[Verifier]) -> int:  # fmt: skip
    """Wait for every rank; the first failure or a signal ends the rest through the ladder."""
    failed: int | None = None
    ended_by: int | None = None
    while any(r.proc.poll() is None for r in ranks):
        for sig in trap.pop():
            if sig in FORWARDED:
                _proc.kill_procs([r.ident for r in ranks if r.proc.poll() is None], sig)
            elif ended_by is None:
                ended_by = sig
                log.info("signal %d: ending the ranks through MPS terminate_client", sig)
                end_ranks(ranks, sig, grace)
        if failed is None and ended_by is None:
            failed = _first_failure(ranks, grace)
        if failed is None and ended_by is None and any(c.failed() for c in checks):
            end_ranks(ranks, signal.SIGTERM, grace)
            failed = VERIFY_FAILED
        checks = [c for c in checks if not c.done]
        select.select([trap.wake_fd], [], [], min([0.05, *(c.due_in() for c in checks)]))
    if ended_by is not None:
        return 128 + ended_by
    return failed if failed is not None else _first_failure(ranks, grace) or 0


def _first_failure(ranks: list[Rank], grace: float) -> int | None:
    for rank in ranks:
        code = rank.proc.poll()
        if code:
            log.error("%s exited with code %d: ending the other ranks", rank.name, exit_code(code))
            end_ranks(ranks, signal.SIGTERM, grace)
            return exit_code(code)
    return None


# --- output ---------------------------------------------------------------------------------
_WRITE_LOCK = threading.Lock()


def _start_pumps(rank: Rank, index: int) -> list[threading.Thread]:
    proc: Any = rank.proc
    threads = []
    for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
        thread = threading.Thread(
            target=_pump,
            args=(stream, f"[{index}] ".encode(), out),
            daemon=True,
            name=f"rank{index}-output",
        )
        thread.start()
        threads.append(thread)
    return threads


def _pump(stream: IO[str], prefix: bytes, out: IO[str]) -> None:
    """Copy lines with the rank prefix; bytes, so output that is not UTF-8 passes intact."""
    raw = getattr(stream, "buffer", stream)
    try:
        for line in iter(raw.readline, b""):
            _write(out, prefix + (line if line.endswith(b"\n") else line + b"\n"))
    finally:
        stream.close()


def _write(out: IO[str], data: bytes) -> None:
    with _WRITE_LOCK:
        target = getattr(out, "buffer", None)
        if target is not None:
            target.write(data)
        else:
            out.write(data.decode(errors="replace"))
        out.flush()


def _join(threads: list[threading.Thread]) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
