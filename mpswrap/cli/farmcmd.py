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
        usage="mpswrap farm [options] TASKS\n"
        "       mpswrap farm status [--json|--failed] [--plot FILE] [DIR]",
        description="Run the lines of TASKS (shell command lines, one per line) K at a time "
        "on each GPU. 'mpswrap farm status [DIR]' shows, from any shell, how the farm of DIR "
        "(a farm directory or its task list; default: every *.farm here) is doing; a task "
        "list named 'status' is given as ./status.",
    )
    for options in inherited:
        add(p, options, inherited=True)
    add(p, FARM_OPTIONS)
    p.add_argument(
        "tasks",
        metavar="TASKS",
        help="a file with one command per line, or - for standard input; "
        "'status' asks how a farm is doing",
    )
    p.add_argument(
        "status_dir",
        nargs="?",
        metavar="DIR",
        help="farm status: the farm's directory, or its task list (default: every *.farm here)",
    )
    _status_dir_after_options(p)
    p = sub.add_parser(
        "calibrate",
        help="time 1, 2, 4, ... copies of a command per GPU, "
        "time-sliced and under MPS, and recommend K and a thread policy",
        usage="mpswrap calibrate [options] -- PROGRAM ...",
    )
    for options in inherited:
        add(p, options, inherited=True)
    add(p, CALIBRATE_OPTIONS)


#: ``farm status``: the one word that is not a task list (``./status`` is one).
STATUS = "status"


def _status_dir_after_options(parser: Any) -> None:
    """``farm status --json DIR``: argparse fills its positionals from the words before the
    first option, so DIR there would be an unrecognised word; it is ``farm status``'s DIR."""
    parse = parser.parse_known_args

    def known(args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = parse(args, namespace)
        words = [w for w in extras if not w.startswith("-")]
        status = getattr(ns, "tasks", None) == STATUS and ns.status_dir is None
        if status and len(words) == 1 and words == extras:
            ns.status_dir, extras = words[0], []
        return ns, extras

    parser.parse_known_args = known


def cmd_farm(args: argparse.Namespace, opts: LaunchOptions) -> int:
    from ..entry.farm import FarmOptions, run_farm
    from ..entry.farmstatus import farm_status

    if args.tasks == STATUS:
        if args.status_dir is not None and args.farm_dir is not None:
            raise UsageError("farm status: give DIR or --dir, not both")
        return farm_status(args.status_dir or args.farm_dir, args.json, args.plot, args.failed)
    if args.status_dir is not None:
        raise UsageError(
            "farm takes one task list",
            thing=args.status_dir,
            hint="mpswrap farm [options] TASKS (or: mpswrap farm status DIR)",
        )
    for given, option in (
        (args.json, "--json"),
        (args.plot, "--plot FILE"),
        (args.failed, "--failed"),
    ):
        if given:
            raise UsageError(
                f"{option.split()[0]} is for farm status", hint=f"mpswrap farm status {option} DIR"
            )
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
