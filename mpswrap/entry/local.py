"""``mpswrap run -n N -- cmd``: N ranks on this machine, no MPI, no scheduler.

This process is the one owner of the attachment: it starts N shielded children with
``MPSWRAP_RANK``/``MPSWRAP_LOCAL_RANK``/``MPSWRAP_NPROCS``/``MPSWRAP_LOCAL_SIZE``, prefixes
each line of their output with ``[rank] ``, and ends the others through the ladder when one
fails (exit code: the first failing rank's) or when a signal arrives (128+signal). At the
end it prints the node's summary line (``job.summary``).
"""

from __future__ import annotations

import functools
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import IO, Any

from .. import _proc
from .._signals import TERMINATING, SignalTrap
from ..config import Settings
from ..errors import UsageError
from ..job.job import Attachment, attach
from ..job.placement import Placement, Slot, check_capacity
from ..job.summary import Outcome
from ..job.supervise import (
    Rank,
    end_ranks,
    guarded,
    killed_on_error,
    outcomes_of,
    spawn_rank,
    watch,
)
from ..job.verify import Verifier
from ..jobenv import JobEnv
from ..mps.gpu import Inventory, load_inventory
from .launch import LaunchOptions, capacity_limits, finish, planned_slots

__all__ = ["run_local"]

log = logging.getLogger(__name__)

#: How long output of ranks that exited may still arrive (a daemonised grandchild can hold
#: the pipe open forever).
DRAIN_TIMEOUT = 5.0


def run_local(opts: LaunchOptions, nprocs: int, command: Sequence[str]) -> int:
    """``mpswrap run -n N -- command``; returns the exit code. Ends with the summary line of
    the node (``job.summary``)."""
    start = time.time()
    if nprocs < 1:
        raise UsageError("bad -n", thing=str(nprocs), cause="need at least one rank")
    if not command:
        raise UsageError("no command to run", hint="mpswrap run -n 4 -- python train.py")
    settings = opts.settings()
    opts = replace(opts, verify_attach=opts.verify_mode(settings))
    env = JobEnv(dict(os.environ))
    # A fresh job per run unless told otherwise: this process is its only owner.
    job = env.job_key(given=opts.job, fresh=f"run-{os.getpid()}")
    assert job is not None
    inventory = load_inventory(settings.gpu_inventory)
    chosen = opts.chosen_gpus(inventory)
    # Every rank starts with our CPUs (affinity policy).
    place_in = functools.partial(opts.place, policy=settings.gpu_policy, rank_cpus=env.cpus_allowed)
    if opts.dry_run:
        slots = planned_slots(settings, env, job, inventory, chosen)
        return _print_plan(functools.partial(place_in, slots), nprocs, command)
    # Signals are only recorded from here on, so that attach and release always complete.
    with SignalTrap() as trap:
        att = attach(settings, env, job, gpus=chosen)
        outcomes: list[Outcome] = []
        try:
            att.announce()
            slots = _checked_slots(att, inventory, nprocs, settings)
            early = [sig for sig in trap.pop() if sig in TERMINATING]
            if early:
                return 128 + early[0]
            code, outcomes = _run_ranks(
                att,
                opts,
                command,
                nprocs,
                trap=trap,
                start=start,
                place_rank=functools.partial(place_in, slots),
                grace=opts.grace_s(settings),
            )
        finally:
            left = finish(att, outcomes, f"job {job}")
    return code or int(left > 0)


def _checked_slots(att: Attachment, inventory: Inventory, n: int, settings: Settings) -> list[Slot]:
    """The attachment's GPUs, once ``n`` more clients are known to fit on them."""
    slots = att.daemons.slots(inventory)
    uuids = [s.uuid for s in slots]
    limits = capacity_limits(uuids, inventory, settings)
    check_capacity(uuids, n, settings.gpu_policy, limits, att.daemons.clients())
    return slots


def _print_plan(place_rank: Callable[[int, int], Placement], n: int, command: Sequence[str]) -> int:
    """``--dry-run``: each rank's GPU, environment and command, ready to paste."""
    for rank in range(n):
        found = place_rank(rank, n)
        shown = " ".join(
            f"{k}={shlex.quote(v)}" for k, v in sorted(_rank_env({}, found, rank, n).items())
        )
        print(f"[{rank}] gpu {found.position} ({found.uuid}): {shown} {shlex.join(command)}")
    return 0


def _rank_env(base: Mapping[str, str], placement: Placement, rank: int, n: int) -> dict[str, str]:
    env = {**base, **placement.env}
    env.update(
        MPSWRAP_RANK=str(rank),
        MPSWRAP_LOCAL_RANK=str(rank),
        MPSWRAP_NPROCS=str(n),
        MPSWRAP_LOCAL_SIZE=str(n),
    )
    return env


def _run_ranks(
    att: Attachment,
    opts: LaunchOptions,
    command: Sequence[str],
    n: int,
    *,
    place_rank: Callable[[int, int], Placement],
    trap: SignalTrap,
    grace: float,
    start: float,
) -> tuple[int, list[Outcome]]:
    """Start, watch and end the N ranks: (the exit code, how each rank ended)."""
    ranks: list[Rank] = []
    pumps: list[threading.Thread] = []
    try:
        for index in range(n):
            found = place_rank(index, n)
            ranks.append(
                spawn_rank(
                    command,
                    _rank_env(os.environ, found, index, n),
                    att.daemons.daemon(found.slot.key),
                    shield=not opts.no_shield,
                    name=f"rank {index}",
                    stdout=_proc.PIPE,
                    stderr=_proc.PIPE,
                    stdin=_proc.DEVNULL,
                )
            )
        with guarded(ranks, grace), killed_on_error(ranks):  # forked before the output threads
            for index, rank in enumerate(ranks):
                pumps += _start_pumps(rank, index)
            checks = Verifier.for_ranks(ranks, opts.verify_attach, opts.verify_timeout)
            code = watch(ranks, trap, grace=grace, checks=checks)
            return code, outcomes_of(ranks, checks, start)
    except BaseException:
        end_ranks(ranks, signal.SIGTERM, grace)  # an error of ours: end them cleanly
        raise
    finally:
        _join(pumps)


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
