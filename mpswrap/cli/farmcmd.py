"""``mpswrap farm``, ``farm status`` and ``calibrate``: their parsed arguments as the options
``entry.farm`` and ``entry.calibrate`` take."""

from __future__ import annotations

import argparse
import os

from ..errors import UsageError
from ..job.run import LaunchOptions
from .nearest import did_you_mean

__all__ = ["cmd_calibrate", "cmd_farm", "cmd_farm_status"]


def cmd_farm(args: argparse.Namespace) -> int:
    from ..entry.farm import FarmOptions, run_farm

    farm_opts = FarmOptions(
        per_gpu=args.per_gpu,
        retries=args.retries,
        directory=args.farm_dir,
        share=args.share,
        progress=args.progress,
        tag=args.tag,
        timeout=args.timeout,
        halt=args.halt,
        skip_failed=args.skip_failed,
        heartbeat=args.heartbeat,
    )
    try:
        return run_farm(LaunchOptions.of(args), farm_opts, args.tasks)
    except UsageError as exc:
        _mistyped_status(exc, args.tasks)
        raise


def _mistyped_status(exc: UsageError, tasks: str) -> None:
    """A task list that does not exist, named like ``status`` (``farm stauts``): say so."""
    near = tasks != "-" and did_you_mean(tasks, ["status"])
    if near and exc.what == "cannot read the task list" and not os.path.exists(tasks):
        exc.cause = f"{exc.cause} (did you mean 'farm status'?)"
        exc.hint = "mpswrap farm status [DIR] tells how a farm is doing"


def cmd_farm_status(args: argparse.Namespace) -> int:
    from ..entry.farmstatus import farm_status

    return farm_status(args.farm_dir, args.json, args.plot, args.failed)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..entry.calibrate import run_calibrate

    counts = args.counts
    if counts is not None and args.top is not None and counts[-1] > args.top:
        raise UsageError(
            "--counts past --max",
            thing=",".join(map(str, counts)),
            cause=f"{counts[-1]} copies, --max {args.top}",
            hint="give --counts alone, or counts up to --max",
        )
    return run_calibrate(
        LaunchOptions.of(args),
        args.program,
        top=args.top,
        counts=counts,
        repeats=args.repeats,
        plot=args.plot,
        as_json=args.json,
        directory=args.farm_dir,
    )
