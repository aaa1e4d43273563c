"""``mpswrap farm`` and ``mpswrap calibrate``: their sub-parsers and handlers (the work lives
in ``entry.farm`` and ``entry.calibrate``)."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .options import CALIBRATE_OPTIONS, FARM_OPTIONS, Options

if TYPE_CHECKING:  # imported by the handlers: building the parser stays light
    from ..job.run import LaunchOptions

__all__ = ["add_parsers", "cmd_calibrate", "cmd_farm"]


def add_parsers(sub: Any, add: Any, inherited: tuple[Options, ...]) -> None:
    """``farm`` and ``calibrate``; ``add(parser, options, inherited)`` adds a table, and the
    ``inherited`` tables (wrapper options, verbosity) are accepted after the word too."""
    p = sub.add_parser(
        "farm",
        help="run many independent commands, K at a time per GPU",
        usage="mpswrap farm [options] TASKS",
    )
    for options in inherited:
        add(p, options, inherited=True)
    add(p, FARM_OPTIONS)
    p.add_argument(
        "tasks", metavar="TASKS", help="a file with one command per line, or - for standard input"
    )
    p = sub.add_parser(
        "calibrate",
        help="time 1, 2, 4, ... copies of a command per GPU, "
        "time-sliced and under MPS, and recommend K and a thread policy",
        usage="mpswrap calibrate [options] -- PROGRAM ...",
    )
    for options in inherited:
        add(p, options, inherited=True)
    add(p, CALIBRATE_OPTIONS)


def cmd_farm(args: argparse.Namespace, opts: LaunchOptions) -> int:
    from ..entry.farm import FarmOptions, run_farm

    farm_opts = FarmOptions(
        per_gpu=args.per_gpu,
        retries=args.retries,
        directory=args.farm_dir,
        share=args.share,
        progress=args.progress,
    )
    return run_farm(opts, farm_opts, args.tasks)


def cmd_calibrate(args: argparse.Namespace, opts: LaunchOptions, command: list[str]) -> int:
    from ..entry.calibrate import run_calibrate

    counts = None
    if args.counts is not None:
        if not re.fullmatch(r"[1-9][0-9]{0,3}(,[1-9][0-9]{0,3})*", args.counts):
            raise UsageError("bad --counts", thing=args.counts, hint="e.g. 1,4,8,12")
        counts = sorted({int(c) for c in args.counts.split(",")})
    return run_calibrate(
        opts,
        command,
        top=args.top,
        counts=counts,
        repeats=args.repeats,
        plot=args.plot,
        as_json=args.json,
        directory=args.farm_dir,
    )
