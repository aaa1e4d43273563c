"""Command line: ``mpswrap <command>`` or ``mpswrap [options] <launcher|program> ...``.

``main()`` parses and dispatches; the work lives in the modules below it. Nothing imports cli.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, Callable, NoReturn

from . import __version__
from .config import Settings, load_settings
from .errors import MpswrapError, UsageError

__all__ = ["main"]

log = logging.getLogger("mpswrap")

COMMANDS = (
    "start",
    "stop",
    "status",
    "config",
    "demo",
    "prolog",
    "task-prolog",
    "epilog",
    "run",
    "version",
)
LAUNCHERS = ("srun", "mpirun", "mpiexec", "orterun", "prun")


class _Parser(argparse.ArgumentParser):
    """Usage errors as one ``mpswrap: ...`` line and a hint, exit 2 (subcommands too)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, hint=f"{self.prog} --help")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", help="verbose logs and tracebacks")
    parser.add_argument("--config", metavar="FILE", help="admin config file to read")


def _job_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", metavar="ID", help="job id (default: $SLURM_JOB_ID or 'local')")
    parser.add_argument("--node", metavar="NAME", help="node name (default: this node)")
    parser.add_argument("--run-dir", metavar="DIR", help="state directory to use")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mpswrap",
        description="Run many CUDA processes per GPU through NVIDIA MPS, on Slurm or alone.",
        epilog="Prefix a launcher: 'mpswrap srun -n 8 ./app', 'mpswrap mpirun -np 8 ./app'; "
        "or wrap each rank: 'srun mpswrap ./app'. 'mpswrap COMMAND --help' for more.",
    )
    parser.add_argument("--version", action="version", version=f"mpswrap {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

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

    p = sub.add_parser("stop", help="end clients (terminate_client), quit and remove daemons")
    _common(p)
    _job_args(p)

    p = sub.add_parser("status", help="daemons, servers, clients and faults of a job")
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

    for name in ("prolog", "task-prolog", "epilog"):
        p = sub.add_parser(name, help=f"Slurm {name} hook (see slurm/README.md)")
        _common(p)
    sub.add_parser("version", help="print the version")
    return parser


def _settings(args: argparse.Namespace, **overrides: Any) -> Settings:
    return load_settings(overrides, config_file=getattr(args, "config", None))


def _setup_logging(debug: bool, level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("mpswrap: %(message)s"))
    root = logging.getLogger("mpswrap")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else getattr(logging, level.upper()))
    root.propagate = False


def _cmd_config(args: argparse.Namespace) -> int:
    settings = _settings(args)
    rows = settings.describe()
    if args.json:
        print(json.dumps({n: {"value": v, "source": s} for n, v, s in rows}, indent=1))
    else:
        width = max(len(n) for n, _, _ in rows)
        for name, value, source in rows:
            print(f"{name:<{width}}  {value:<40}  ({source})")
    return 0


def _dispatch_module(name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from importlib import import_module

        module = import_module(f"mpswrap.{name}")
        result: int = module.cli(args)
        return result

    return run


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "config": _cmd_config,
    "start": _dispatch_module("manage"),
    "stop": _dispatch_module("manage"),
    "status": _dispatch_module("manage"),
    "demo": _dispatch_module("demo"),
    "prolog": _dispatch_module("hooks"),
    "task-prolog": _dispatch_module("hooks"),
    "epilog": _dispatch_module("hooks"),
}


def _wants_launcher(argv: Sequence[str]) -> bool:
    """True when argv is ``[wrapper options] <launcher or program> ...`` or ``run ...``."""
    first = next((a for a in argv if a == "--" or not a.startswith("-")), None)
    if first is None:
        return False
    return first in ("--", "run") or first not in COMMANDS


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv[:1] or os.environ.get("MPSWRAP_DEBUG") == "1"
    _setup_logging(debug)
    try:
        if argv and _wants_launcher(argv) and argv[0] not in ("-h", "--help", "--version"):
            from .launcher import cli as launcher_cli

            code: int = launcher_cli(argv)
            return code
        args = build_parser().parse_args(argv)
        if args.command in (None, "version"):
            print(f"mpswrap {__version__}") if args.command else build_parser().print_help()
            return 0 if args.command else 2
        _setup_logging(args.debug or debug)
        return HANDLERS[args.command](args)
    except MpswrapError as exc:
        if debug:
            log.exception("failed")
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
