"""``mpswrap run -n N -- cmd``: N ranks on this machine, no MPI, no scheduler.

This process is the one owner of the attachment: it starts N shielded children with
``MPSWRAP_RANK``/``MPSWRAP_LOCAL_RANK``/``MPSWRAP_NPROCS``/``MPSWRAP_LOCAL_SIZE``, prefixes
each line of their output with ``[rank] ``, and ends the others through the ladder when one
fails (exit code: the first failing rank's) or when a signal arrives (128+signal). At the
end it prints the node's summary line (``report.summary``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

from .. import _proc
from ..errors import MpswrapError, UsageError
from ..job.run import LaunchOptions, Result, Run, plan
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
from ..report.summary import print_summary

__all__ = ["cli", "run_local"]

log = logging.getLogger(__name__)

#: How long output of ranks that exited may still arrive (a daemonised grandchild can hold
#: the pipe open forever).
DRAIN_TIMEOUT = 5.0


def cli(args: Any) -> int:
    """``mpswrap run -n N [options] -- PROGRAM ...``, from the command table."""
    return run_local(LaunchOptions.of(args), args.nprocs, args.program)


def run_local(opts: LaunchOptions, nprocs: int, command: Sequence[str]) -> int:
    """``mpswrap run -n N -- command``; returns the exit code. One run of the run lifecycle
    (``job.run``): its body starts, watches and ends the N ranks."""
    if nprocs < 1:
        raise UsageError("bad -n", thing=str(nprocs), cause="need at least one rank")
    if not command:
        raise UsageError("no command to run", hint="mpswrap run -n 4 -- python train.py")
    planned = plan(opts, "run").use(nprocs)
    planned.check_program(command)
    if opts.dry_run:
        for rank in range(nprocs):
            print(planned.dry_run_line(rank, nprocs, command, _rank_vars(rank, nprocs)))
        return 0
    outputs = _Outputs()
    with Run(planned, summary=print_summary) as run:
        run.result = run.stopped or _run_ranks(run, command=command, n=nprocs, outputs=outputs)
    outputs.check()
    return run.code


def _rank_vars(rank: int, n: int) -> dict[str, str]:
    """What ``mpswrap run`` tells each rank of its place among the N."""
    return {
        "MPSWRAP_RANK": str(rank),
        "MPSWRAP_LOCAL_RANK": str(rank),
        "MPSWRAP_NPROCS": str(n),
        "MPSWRAP_LOCAL_SIZE": str(n),
    }


def _run_ranks(run: Run, *, command: Sequence[str], n: int, outputs: _Outputs) -> Result:
    """Start, watch and end the N ranks; what they came to. How each ended goes to the run
    record (``run.ended``)."""
    planned = run.plan
    opts, settings = planned.opts, planned.settings
    grace = opts.grace_s(settings)
    ranks: list[Rank] = []
    pumps: list[threading.Thread] = []
    try:
        for index in range(n):
            found = planned.place(index, n)
            ranks.append(
                spawn_rank(
                    command,
                    {**os.environ, **found.env, **_rank_vars(index, n)},
                    run.daemon(found.slot),
                    shield=not opts.no_shield,
                    name=f"rank {index}",
                    stdout=_proc.PIPE,
                    stderr=_proc.PIPE,
                    stdin=_proc.DEVNULL,
                )
            )
        with guarded(ranks, grace), killed_on_error(ranks):  # forked before the output threads
            for index, rank in enumerate(ranks):
                pumps += _start_pumps(rank, index, outputs)
            mode = opts.verify_mode(settings)
            checks = Verifier.for_ranks(ranks, mode, opts.verify_timeout)
            code = watch(ranks, run.trap, grace=grace, checks=checks)
            run.ended(*outcomes_of(ranks, checks, run.start))
            return Result(code)
    except BaseException:
        end_ranks(ranks, signal.SIGTERM, grace)  # an error of ours: end them cleanly
        raise
    finally:
        _join(pumps)


# --- output ---------------------------------------------------------------------------------
_WRITE_LOCK = threading.Lock()


class _Outputs:
    """The first error writing each of mpswrap's outputs (``stdout``, ``stderr``) the ranks'
    lines go to: once one fails, what comes for it is read and dropped, so a rank never
    blocks on a full pipe."""

    def __init__(self) -> None:
        self.failed: dict[str, BaseException] = {}

    def check(self) -> None:
        """After the run, standard output's failure as ``main`` says its own: a reader that
        left (``| head -1``) ends quietly (141); any other (a full disk) is one line, exit 1.
        A failing standard error has nowhere left to be said."""
        exc = self.failed.get("stdout")
        if isinstance(exc, BrokenPipeError):
            raise BrokenPipeError
        if isinstance(exc, MpswrapError):  # cli.output's translation of the flush
            raise exc
        if exc is not None:
            cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise MpswrapError("cannot write output", cause=cause)


def _start_pumps(rank: Rank, index: int, outputs: _Outputs) -> list[threading.Thread]:
    proc: Any = rank.proc
    threads = []
    for stream, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
        thread = threading.Thread(
            target=_pump,
            args=(stream, f"[{index}] ".encode(), name, outputs),
            daemon=True,
            name=f"rank{index}-output",
        )
        thread.start()
        threads.append(thread)
    return threads


def _pump(stream: IO[str], prefix: bytes, name: str, outputs: _Outputs) -> None:
    """Copy lines with the rank prefix to mpswrap's output ``name``; bytes, so output that
    is not UTF-8 passes intact. Once that output has failed (its reader left: ``mpswrap run
    ... | head -1``), the rest is read and dropped (``_Outputs``)."""
    raw = getattr(stream, "buffer", stream)
    try:
        for line in iter(raw.readline, b""):
            if name not in outputs.failed:
                _write(name, prefix + (line if line.endswith(b"\n") else line + b"\n"), outputs)
    finally:
        stream.close()


def _write(name: str, data: bytes, outputs: _Outputs) -> None:
    """``data`` to mpswrap's output ``name``; its first error kept in ``outputs``."""
    out = getattr(sys, name)
    with _WRITE_LOCK:
        try:
            target = getattr(out, "buffer", None)
            if target is not None:
                target.write(data)
            else:
                out.write(data.decode(errors="replace"))
            out.flush()
        except (OSError, ValueError, MpswrapError) as exc:  # ValueError: closed meanwhile
            outputs.failed.setdefault(name, exc)


def _join(threads: list[threading.Thread]) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
