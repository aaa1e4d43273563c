"""Command line: one parser for every mode.

``mpswrap [options] WORD ...``: the first word after the wrapper options picks the mode,
the same way every time:

- a command (``start``, ``stop``, ``status``, ``config``, ``demo``, ``run``, the Slurm hooks,
  ``version``);
- a launcher (``srun``, ``mpirun``, ``mpiexec``, ``orterun``): prefix mode;
- anything else, or anything after ``--``: one rank (``srun mpswrap ./app``).

``main()`` parses and dispatches; the work lives in ``entry`` and ``cli.manage``. Nothing
imports this module.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import Any, Callable, NoReturn

from .. import __version__
from ..config import load_settings
from ..entry import launchargs
from ..entry.launch import LaunchOptions
from ..errors import MpswrapError, UsageError, internal_error
from ..job.placement import provision_threads

__all__ = ["build_parser", "main"]

log = logging.getLogger("mpswrap")

HOOK_COMMANDS = ("prolog", "task-prolog", "epilog")
_SIZE = re.compile(r"^[1-9][0-9]*[MG]$")

Options = tuple[tuple[tuple[str, ...], dict[str, Any]], ...]
#: The wrapper options: before a launcher or program, and in ``run`` (written once).
# fmt: off
WRAPPER_OPTIONS: Options = (
    (("--gpus",), {"metavar": "LIST", "help": "GPUs to use: 'all', NVML indices or UUIDs"}),
    (("--policy",), {"choices": ("block", "cyclic", "affinity"), "help": "rank to GPU mapping"}),
    (("--threads",), {"metavar": "SPEC", "help": "active thread %%: none, uniform, "
                      "oversubscribe, a percent, or weights w1:w2:..."}),
    (("--mem-limit",), {"metavar": "SIZE", "help": "pinned device memory per client: "
                        "auto (GPU memory / ranks on it) or e.g. 8G, 512M"}),
    (("--priority",), {"type": int, "choices": (0, 1), "help": "client priority (1 = below)"}),
    (("--verify-attach",), {"choices": ("fail", "warn"),
                            "help": "check each rank became an MPS client"}),
    (("--verify-timeout",), {"type": float, "default": 30.0, "metavar": "S",
                             "help": "seconds to wait for attachment (default 30)"}),
    (("--no-shield",), {"action": "store_true",
                        "help": "let TERM/INT/HUP reach the program directly"}),
    (("--grace",), {"type": float, "metavar": "S",
                    "help": "seconds from signal to SIGKILL (default: kill_grace)"}),
    (("--dry-run",), {"action": "store_true", "help": "print what would run; start nothing"}),
    (("--job",), {"metavar": "ID", "help": "job id for the per-job state (default: Slurm's)"}),
    (("--debug",), {"action": "store_true", "help": "verbose logs and tracebacks"}),
)
# fmt: on
RUN_OPTIONS: Options = (
    (("-n", "--np"), {"type": int, "required": True, "dest": "nprocs", "help": "ranks to start"}),
)


class _Parser(argparse.ArgumentParser):
    """Usage errors as one ``mpswrap: ...`` line and a hint, exit 2 (subcommands too)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, hint=f"{self.prog} --help")


def _add(parser: argparse.ArgumentParser, options: Options, inherited: bool = False) -> None:
    """Add ``options``; ``inherited``: the top level set them already (no default here, or
    argparse would overwrite the top level's value with this one's)."""
    for flags, kwargs in options:
        parser.add_argument(*flags, **({**kwargs, "default": argparse.SUPPRESS}
                                       if inherited else kwargs))  # fmt: skip


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="verbose logs and tracebacks")  # fmt: skip
    parser.add_argument("--config", metavar="FILE", help="admin config file to read")


def _job_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--job",
        metavar="ID",
        default=argparse.SUPPRESS,
        help="job id (default: Slurm's; else every job of yours here)",
    )
    parser.add_argument("--node", metavar="NAME", help="node name (default: this node)")
    parser.add_argument("--run-dir", metavar="DIR", help="state directory to use")


def _commands(sub: Any) -> None:
    p = sub.add_parser("start", help="start one MPS daemon per GPU (user mode or as root)")
    _common(p)
    _job_args(p)
    p.add_argument("--gpus", default="all", help="'all', NVML indices (0,2-3) or UUIDs")
    p.add_argument("--user", help="run the daemons as this user (root only)")
    p.add_argument("--cpus", help="CPUs the daemons may use (intersected with GPU-local CPUs)")
    p.add_argument("--threads", help="default active thread percentage")
    p.add_argument("--mem-limit", help="default pinned device memory limit (e.g. 8G)")
    p.add_argument("--priority", choices=("0", "1"), help="default client priority")
    p.add_argument("--prestart", action="store_true", help="start the MPS server now")
    p.add_argument("--json", action="store_true", help="print the manifests as JSON")
    for name, text in (
        ("stop", "end clients (terminate_client), quit and remove daemons"),
        ("status", "daemons, servers, clients and faults of your jobs"),
    ):
        p = sub.add_parser(name, help=text)
        _common(p)
        _job_args(p)
        p.add_argument("--json", action="store_true", help="machine-readable output")
    p = sub.add_parser("config", help="show resolved settings and where each came from")
    _common(p)
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("demo", help="start MPS, run clients, show status, tear down")
    _common(p)
    p.add_argument("--clients", type=int, default=4, help="number of clients (default 4)")
    p.add_argument(
        "--simulate",
        choices=("auto", "yes", "no"),
        default="auto",
        help="use the built-in MPS simulator (auto: when no GPU/MPS is found)",
    )
    p = sub.add_parser("run", help="run N ranks of a command on this node: run -n N -- CMD")
    _add(p, WRAPPER_OPTIONS, inherited=True)
    _add(p, RUN_OPTIONS)
    for name in HOOK_COMMANDS:
        _common(sub.add_parser(name, help=f"Slurm {name} hook (see slurm/README.md)"))
    sub.add_parser("version", help="print the version")


def build_parser() -> argparse.ArgumentParser:
    """The one parser: wrapper options at the top, then a command or a launcher/program."""
    parser = _Parser(
        prog="mpswrap",
        usage="mpswrap [options] COMMAND ... | mpswrap [options] (srun|mpirun|mpiexec|orterun)"
        " ... | mpswrap [options] [--] PROGRAM ...",
        description="Run many CUDA processes per GPU through NVIDIA MPS, on Slurm or alone.",
        epilog="Prefix a launcher: 'mpswrap srun -n 8 ./app', 'mpswrap mpirun -np 8 ./app'; "
        "wrap each rank: 'srun mpswrap ./app'; no scheduler: 'mpswrap run -n 4 -- ./app'. "
        "'mpswrap COMMAND --help' for more.",
    )
    parser.add_argument("--version", action="version", version=f"mpswrap {__version__}")
    _add(parser, WRAPPER_OPTIONS)
    _commands(parser.add_subparsers(dest="command", metavar="COMMAND", prog="mpswrap"))
    return parser


def _valued(options: Options) -> set[str]:
    return {f for flags, kw in options if kw.get("action") != "store_true" for f in flags}


def split_options(argv: Sequence[str], valued: set[str]) -> tuple[list[str], list[str], bool]:
    """(wrapper options, the rest, whether ``--`` ended them): options end at the first
    positional word or ``--``."""
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--":
            return list(argv[:index]), list(argv[index + 1 :]), True
        if not word.startswith("-") or word == "-":
            break
        index += 2 if word in valued else 1
    return list(argv[:index]), list(argv[index:]), False


def _options(args: argparse.Namespace) -> LaunchOptions:
    _check_args(args)
    return LaunchOptions(**{f.name: getattr(args, f.name) for f in fields(LaunchOptions)})


def _check_args(args: argparse.Namespace) -> None:
    if args.threads is not None:
        provision_threads(args.threads, 1, 0)  # raises UsageError naming the valid forms
    if args.mem_limit not in (None, "auto") and not _SIZE.match(args.mem_limit):
        raise UsageError("bad --mem-limit", thing=args.mem_limit, hint="use auto, 8G or 512M")
    if args.verify_timeout <= 0 or (args.grace is not None and args.grace < 0):
        raise UsageError("--verify-timeout and --grace must be positive")


def _cmd_config(args: argparse.Namespace) -> int:
    rows = load_settings(config_file=args.config).describe()
    if args.json:
        print(json.dumps({n: {"value": v, "source": s} for n, v, s in rows}, indent=1))
    else:
        width = max(len(n) for n, _, _ in rows)
        for name, value, source in rows:
            print(f"{name:<{width}}  {value:<40}  ({source})")
    return 0


def _cmd_manage(args: argparse.Namespace) -> int:
    from . import manage

    return manage.COMMANDS[args.command](args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import cli

    return cli(args)


def _cmd_hook(args: argparse.Namespace) -> int:
    from ..entry.hooks import run_hook

    return run_hook(args.command, args.config)


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"mpswrap {__version__}")
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "config": _cmd_config,
    "start": _cmd_manage,
    "stop": _cmd_manage,
    "status": _cmd_manage,
    "demo": _cmd_demo,
    "version": _cmd_version,
    **dict.fromkeys(HOOK_COMMANDS, _cmd_hook),
}


def dispatch(argv: list[str]) -> int:
    """Parse ``argv`` with the one parser and run the mode its first word picks."""
    parser = build_parser()
    head, rest, dashdash = split_options(argv, _valued(WRAPPER_OPTIONS))
    if not dashdash and rest and rest[0] == "run":
        run_head, command, _ = split_options(rest[1:], _valued((*WRAPPER_OPTIONS, *RUN_OPTIONS)))
        args = parser.parse_args([*head, "run", *run_head])
        _setup_logging(args.debug)
        from ..entry.local import run_local

        return run_local(_options(args), args.nprocs, command)
    if not dashdash and rest and rest[0] in HANDLERS:
        args = parser.parse_args(argv)
        _setup_logging(args.debug)
        return HANDLERS[args.command](args)
    args = parser.parse_args(head)
    if not rest:
        if dashdash:
            raise UsageError("no program given after --", hint="mpswrap --help")
        parser.print_help()
        return 2
    _setup_logging(args.debug)
    if not dashdash and launchargs.family_of(rest[0]):
        from ..entry.launch import prefix

        return prefix(_options(args), rest)
    if not args.debug:  # "daemon already running" from every rank is noise at 48 ranks a GPU
        logging.getLogger("mpswrap").setLevel(logging.WARNING)
    from ..entry.launch import per_rank

    return per_rank(_options(args), rest)


def _setup_logging(debug: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("mpswrap: %(message)s"))
    root = logging.getLogger("mpswrap")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug or _debug_env() else logging.INFO)
    root.propagate = False


def _debug_env() -> bool:
    return os.environ.get("MPSWRAP_DEBUG") == "1"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _setup_logging(False)
    try:
        return dispatch(argv)
    except SystemExit as exc:  # --help, --version
        return int(exc.code or 0)
    except MpswrapError as exc:
        if "--debug" in argv or _debug_env():
            log.exception("failed")
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug or an error no module translated: one line all the same
        log.debug("traceback", exc_info=exc)
        print(f"mpswrap: {internal_error(exc, 'with --debug')}", file=sys.stderr)
        return 1
