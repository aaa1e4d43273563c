"""Command line: one parser for every mode.

``mpswrap [options] WORD ...``: the first word after the wrapper options picks the mode,
the same way every time, before anything touches NVML or a daemon:

- a command (``start``, ``stop``, ``status``, ``config``, ``demo``, ``run``, ``help``,
  ``version``, ``install-hooks``, ``uninstall-hooks``, the Slurm hooks);
- a launcher (``srun``, ``mpirun``, ``mpiexec``, ``orterun``): prefix mode;
- a program: a word with a ``/``, or one found on PATH; anything after ``--`` always is one
  (per-rank mode, ``srun mpswrap ./app``);
- anything else is a mistyped command: exit 2 with the nearest command named.

``-v``/``-q``/``--debug`` are accepted before and after a command word. ``main()`` parses and
dispatches; the work lives in ``entry`` and ``cli.manage``. Nothing imports this module.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from .. import __version__, trust
from .._struct import fields
from ..config import Settings, admin_file, load_settings
from ..errors import (
    ConfigError,
    GpuChoiceError,
    MpswrapError,
    TrustError,
    UsageError,
    internal_error,
)
from ..job.containers import PROGRAMS
from ..job.launchers import launcher_of
from ..job.placement import provision_threads
from .logs import debug_env, setup_logging
from .options import (
    CALIBRATE_OPTIONS,
    HOOK_COMMANDS,
    LAUNCHERS,
    MODES,
    RUN_OPTIONS,
    VERBOSITY,
    WRAPPER_OPTIONS,
    Options,
    at_least,
    job_id,
    node_name,
    path,
    seconds,
)

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # the launcher's modules are imported by the modes that launch, not by hooks
    from typing import Any, NoReturn

    from ..job.run import LaunchOptions

__all__ = ["build_parser", "main"]

log = logging.getLogger("mpswrap")

_SIZE = re.compile(r"^[1-9][0-9]*[MG]$")


class _Parser(argparse.ArgumentParser):
    """Usage errors as one ``mpswrap: ...`` line and a hint, exit 2 (subcommands too)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, hint=f"{self.prog} --help")


def _add(parser: Any, options: Options, inherited: bool = False) -> None:
    """Add ``options``; ``inherited``: the top level set them already (no default here, or
    argparse would overwrite the top level's value with this one's)."""
    for flags, kwargs in options:
        parser.add_argument(
            *flags, **({**kwargs, "default": argparse.SUPPRESS} if inherited else kwargs)
        )


def _common(parser: argparse.ArgumentParser, config: bool = True) -> None:
    _add(parser, VERBOSITY, inherited=True)
    if config:
        parser.add_argument(
            "--config",
            metavar="FILE",
            type=path,
            help="admin config file to read (default: $MPSWRAP_CONFIG, else "
            "/etc/mpswrap/mpswrap.conf)",
        )


def _job_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--job",
        metavar="ID",
        default=argparse.SUPPRESS,
        type=job_id,
        help="job id (default: Slurm's; else every job of yours here)",
    )
    parser.add_argument(
        "--node", metavar="NAME", type=node_name, help="node name (default: this node)"
    )
    parser.add_argument(
        "--run-dir",
        metavar="DIR",
        type=path,
        help="state directory to use (default: the run_dir setting as root, else user_run_dir)",
    )


def _commands(sub: Any) -> None:
    p = sub.add_parser("start", help="start one MPS daemon per GPU (user mode or as root)")
    _common(p)
    _job_args(p)
    p.add_argument(
        "--gpus",
        metavar="LIST",
        default="all",
        help="'all', NVML indices (0,2-3) or UUIDs (default: all)",
    )
    p.add_argument("--user", help="run the daemons as this user, root only (default: you)")
    p.add_argument(
        "--cpus",
        metavar="LIST",
        help="CPUs the daemons may use, intersected with GPU-local CPUs "
        "(default: every CPU this process may use)",
    )
    p.add_argument(
        "--threads",
        metavar="PERCENT",
        help="default active thread percentage (default: the active_thread_percentage "
        "setting, none)",
    )
    p.add_argument(
        "--mem-limit",
        metavar="SIZE",
        help="default pinned device memory limit, e.g. 8G (default: the pinned_mem_limit "
        "setting, none)",
    )
    p.add_argument(
        "--priority",
        choices=("0", "1"),
        help="default client priority (default: the client_priority setting, none)",
    )
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
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = sub.add_parser("demo", help="start MPS, run clients, show status, tear down")
    _common(p)
    p.add_argument(
        "--clients",
        type=at_least(1),
        default=4,
        metavar="N",
        help="number of clients, at most the GPUs' MPS client limits (default: 4)",
    )
    p.add_argument(
        "--simulate",
        choices=("auto", "yes", "no"),
        default="auto",
        help="use the built-in MPS simulator; auto: when no GPU/MPS is found (default: auto)",
    )
    p = sub.add_parser(
        "run",
        help="run N ranks of a command on this node: run -n N -- CMD",
        usage="mpswrap run -n N [options] -- PROGRAM ...",
    )
    _add(p, WRAPPER_OPTIONS, inherited=True)
    _add(p, VERBOSITY, inherited=True)
    _add(p, RUN_OPTIONS)
    from .farmcmd import add_parsers

    add_parsers(sub, _add, (WRAPPER_OPTIONS, VERBOSITY))
    _admin_commands(sub)


def _admin_commands(sub: Any) -> None:
    p = sub.add_parser("report", help="a finished job's record (log_archive): clients, faults")
    _common(p)
    p.add_argument("job_id", metavar="JOB", type=job_id, help="the job id (required)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub.choices["status"].add_argument(
        "--watch",
        nargs="?",
        type=seconds(),
        const=2.0,
        metavar="S",
        help="print it again every S seconds (2 when S is not given) until interrupted "
        "(default: once)",
    )
    p = sub.add_parser("metrics", help="daemons, servers, clients in Prometheus text format")
    _common(p)
    _job_args(p)
    for parser in (sub.choices["status"], p):
        parser.add_argument(
            "--all",
            action="store_true",
            help="every job here (root: every user's), even inside a job",
        )
    p.add_argument(
        "--textfile",
        metavar="DIR",
        type=path,
        help="write DIR/mpswrap.prom, for node_exporter's textfile collector (default: print "
        "to standard output)",
    )
    p.add_argument(
        "--process-labels",
        action="store_true",
        help="one series per client process, with its pid (and command in "
        "mpswrap_client_info): a new series for every process, so off by default",
    )
    p = sub.add_parser(
        "container-args", help="flags a container runtime needs to reach the job's MPS daemons"
    )
    _common(p)
    p.add_argument(
        "runtime",
        metavar="RUNTIME",
        choices=PROGRAMS,
        help=f"{', '.join(PROGRAMS[:-1])} or {PROGRAMS[-1]}",
    )
    p.add_argument(
        "--job",
        metavar="ID",
        default=None,
        type=job_id,
        help="the job whose daemons to bind (default: the launcher's or Slurm's; outside a job, "
        "every job mpswrap run starts for you here)",
    )
    for name in HOOK_COMMANDS:
        _common(sub.add_parser(name, help=f"Slurm {name} hook (see slurm/README.md)"))
    _common(sub.add_parser("version", help="print the version"), config=False)
    from ..slurm import install

    p = sub.add_parser("install-hooks", help="install the Slurm hook shims (root; slurm/README.md)")
    install.add_install_arguments(p)
    _common(p, config=False)
    p = sub.add_parser("uninstall-hooks", help="remove the Slurm hook shims (root)")
    install.add_uninstall_arguments(p)
    _common(p, config=False)
    from .simcmd import add_parser

    add_parser(sub)
    p = sub.add_parser("completion", help="print the bash completion script")
    p.add_argument(
        "shell", nargs="?", choices=("bash",), default="bash", help="the shell (default: bash)"
    )
    p = sub.add_parser("help", help="this help, or a command's: help COMMAND")
    p.add_argument(
        "topic", nargs="?", metavar="COMMAND", help="the command to explain (default: all)"
    )
    p.add_argument("--man-path", action="store_true", help="print where the man page mpswrap(1) is")
    _describe(sub)


def _describe(sub: Any) -> None:
    """Each command's description and examples (``helptext``), and the help of an inherited
    option where it means something else there."""
    import textwrap

    from . import helptext

    for name, parser in sub.choices.items():
        text, examples = helptext.COMMANDS[name]
        parser.description = textwrap.fill(text, 79)
        parser.epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples)
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        for action in parser._actions:
            for flag in action.option_strings:
                action.help = helptext.OPTION_HELP.get((name, flag), action.help)


def build_parser(commands: bool = True) -> argparse.ArgumentParser:
    """The one parser: wrapper options at the top, then a command or a launcher/program.
    ``commands=False``: without the commands' sub-parsers, for the launcher and program modes,
    which parse only the wrapper options (every rank of a job starts that way)."""
    parser = _Parser(
        prog="mpswrap",
        usage=f"mpswrap [options] COMMAND ... | mpswrap [options] ({'|'.join(LAUNCHERS)})"
        " ... | mpswrap [options] [--] PROGRAM ...",
        description=MODES,
        epilog="'mpswrap help COMMAND' or 'mpswrap COMMAND --help' for a command's options. "
        "Settings (mpswrap config) come from MPSWRAP_<NAME> variables and the admin file.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mpswrap {__version__}")
    _add(
        parser.add_argument_group("launch options (prefix, per-rank and run modes)"),
        WRAPPER_OPTIONS,
    )
    _add(parser.add_argument_group("output"), VERBOSITY)
    if commands:
        _commands(parser.add_subparsers(dest="command", metavar="COMMAND", prog="mpswrap"))
    return parser


def _valued(options: Options) -> set[str]:
    flag_actions = ("store_true", "count")
    return {f for flags, kw in options if kw.get("action") not in flag_actions for f in flags}


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
    from ..job.run import LaunchOptions

    _check_args(args)
    return LaunchOptions(**{name: getattr(args, name) for name in fields(LaunchOptions)})


def _check_args(args: argparse.Namespace) -> None:
    if args.threads is not None:
        provision_threads(args.threads, 1, 0)  # raises UsageError naming the valid forms
    if args.mem_limit not in (None, "auto") and not _SIZE.match(args.mem_limit):
        raise UsageError("bad --mem-limit", thing=args.mem_limit, hint="use auto, 8G or 512M")


def _cmd_config(args: argparse.Namespace) -> int:
    """The resolved settings; on stderr, a warning for each file root's hooks refuse to read
    or run (a bad key or value still fails the command: install-hooks relies on that)."""
    problems: list[ConfigError] = []
    settings = load_settings(config_file=args.config, problems=problems)
    for problem in problems:
        if not isinstance(problem, TrustError):
            raise problem
    rows = settings.describe()
    if args.json:
        import json

        print(json.dumps({n: {"value": v, "source": s} for n, v, s in rows}, indent=1))
    else:
        width = max(len(n) for n, _, _ in rows)
        for name, value, source in rows:
            print(f"{name:<{width}}  {value:<40}  ({source})")
    for line in _untrusted(settings, args.config):
        print(f"mpswrap: warning: {line}", file=sys.stderr)
    return 0


def _untrusted(settings: Settings, config_file: str | None) -> list[str]:
    """The admin file and control program, where a user other than root may change them:
    root's hooks then neither read nor run them (``trust``), whoever asks."""
    from ..mps.control import locate_binary

    found = []
    path = admin_file(os.environ, config_file)
    level = trust.changeable_level(path) if os.path.exists(path) else None
    if level:
        found.append(
            f"root ignores the admin config file {path}: {level} can be changed by "
            "a user other than root"
        )
    try:
        binary: str | None = locate_binary(settings.control_binary)
    except MpswrapError:
        binary = None  # not installed here: nothing to judge
    level = trust.changeable_level(binary) if binary else None
    if level:
        found.append(
            f"root will not run the MPS control program {binary}: {level} can be "
            "changed by a user other than root"
        )
    return found


def _cmd_manage(args: argparse.Namespace) -> int:
    from . import manage

    return manage.COMMANDS[args.command](args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import cli

    return cli(args)


def _cmd_sim(args: argparse.Namespace) -> int:
    from .simcmd import cmd_sim

    return cmd_sim(args)


def _cmd_hook(args: argparse.Namespace) -> int:
    from ..entry.hooks import run_hook

    return run_hook(args.command, args.config)


def _cmd_hooks_install(args: argparse.Namespace) -> int:
    from ..slurm import install

    return install.install(args) if args.command == "install-hooks" else install.uninstall(args)


def _cmd_farm(args: argparse.Namespace) -> int:
    from .farmcmd import cmd_farm

    return cmd_farm(args, _options(args))


def _cmd_container_args(args: argparse.Namespace) -> int:
    from ..job import containers
    from ..jobenv import JobEnv

    runtime = containers.runtime_named(args.runtime)
    settings = load_settings(config_file=args.config)
    directory = containers.bind_dir(settings, JobEnv.current(), args.job)
    out = containers.flags(runtime, directory, os.getuid())
    if any(re.search(r"\s", word) for word in out):  # $(...) splits words at blanks
        raise UsageError(
            "the job's directory has a blank in its path",
            thing=str(directory),
            hint="set user_run_dir to a path without blanks",
        )
    print(" ".join(out))
    return 0


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"mpswrap {__version__}")
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "config": _cmd_config,
    "start": _cmd_manage,
    "stop": _cmd_manage,
    "status": _cmd_manage,
    "metrics": _cmd_manage,
    "report": _cmd_manage,
    "demo": _cmd_demo,
    "container-args": _cmd_container_args,
    "farm": _cmd_farm,
    "version": _cmd_version,
    "install-hooks": _cmd_hooks_install,
    "uninstall-hooks": _cmd_hooks_install,
    **dict.fromkeys(HOOK_COMMANDS, _cmd_hook),
}


def dispatch(argv: list[str]) -> int:
    """Parse ``argv`` with the one parser and run the mode its first word picks."""
    head, rest, dashdash = split_options(argv, _valued(WRAPPER_OPTIONS))
    mode = _mode(rest, dashdash)
    asks_help = any(word in ("-h", "--help") for word in head)
    parser = build_parser(commands=asks_help or mode not in ("launcher", "program"))
    if mode in ("run", "calibrate"):
        return _command_after_dashes(parser, mode, head, rest[1:])
    if mode == "command":
        args = parser.parse_args(argv)
        setup_logging(args, "info")
        with _gpus_at_fault(args):
            return HANDLERS[args.command](args)
    args = parser.parse_args(head)
    if mode == "none":
        if dashdash:
            raise UsageError("no program given after --", hint="mpswrap --help")
        parser.print_help()
        raise UsageError("no command, launcher or program given", hint="mpswrap --help")
    if mode == "launcher":
        setup_logging(args, "info")
        from ..entry.launch import prefix

        with _gpus_at_fault(args):
            return prefix(_options(args), rest)
    # One rank of many: "daemon already running" from every rank is noise at 48 ranks a GPU.
    setup_logging(args, "warning")
    from ..entry.launch import per_rank
    from ..job.supervise import check_program

    opts = _options(args)  # usage errors (2) first, then 127/126, before NVML or a daemon
    check_program(rest, os.environ)
    with _gpus_at_fault(args):
        return per_rank(opts, rest)


@contextmanager
def _gpus_at_fault(args: argparse.Namespace) -> Iterator[None]:
    """A GPU list naming a GPU this node lacks (exit 2) names ``--gpus`` when it came from
    there (not from the step's CUDA_VISIBLE_DEVICES)."""
    try:
        yield
    except GpuChoiceError as exc:
        if getattr(args, "gpus", None) is not None:
            exc.with_context("--gpus")
        raise


def _command_after_dashes(
    parser: argparse.ArgumentParser, mode: str, head: list[str], rest: list[str]
) -> int:
    """``run`` and ``calibrate``: their options, then ``--`` and the program."""
    own = RUN_OPTIONS if mode == "run" else CALIBRATE_OPTIONS
    mode_head, command, _ = split_options(rest, _valued((*WRAPPER_OPTIONS, *own)))
    args = parser.parse_args([*head, mode, *mode_head])
    setup_logging(args, "info")
    from ..entry.local import run_local
    from .farmcmd import cmd_calibrate

    with _gpus_at_fault(args):
        if mode == "calibrate":
            return cmd_calibrate(args, _options(args), command)
        return run_local(_options(args), args.nprocs, command)


def _mode(rest: Sequence[str], dashdash: bool) -> str:
    """What the first word after the wrapper options is: ``command``, ``run``,
    ``launcher``, ``program`` or ``none``; a word that is none of these is a UsageError."""
    if not rest:
        return "none"
    word = rest[0]
    if dashdash:
        return "program"
    if word in ("run", "calibrate"):
        return word
    if word in HANDLERS:
        return "command"
    if launcher_of(word):
        return "launcher"
    if "/" in word or shutil.which(word):
        return "program"
    raise UsageError(
        f"unknown command '{word}'{_did_you_mean(word)}",
        hint="mpswrap help lists the commands; to run a program, give its path "
        f"or use 'mpswrap -- {word}'",
    )


def _did_you_mean(word: str) -> str:
    """`` (did you mean 'X'?)`` for a close match only: the one word that starts with
    ``word``, or one a typo or two away (difflib's ratio 0.75: 'stauts', 'hlep'); else
    nothing ('logs' is no 'prolog'; 'sta' could be start or status)."""
    words = [*HANDLERS, "run", "calibrate", *LAUNCHERS]
    starting = [w for w in words if w.startswith(word)]
    if len(starting) > 1:
        return ""
    import difflib

    near = starting or difflib.get_close_matches(word, words, n=1, cutoff=0.75)
    return f" (did you mean '{near[0]}'?)" if near else ""


def _cmd_help(args: argparse.Namespace) -> int:
    parser = build_parser()
    if args.man_path:
        from . import manpage

        print(manpage.shipped())
        return 0
    if args.topic is None:
        parser.print_help()
        return 0
    if args.topic not in (*HANDLERS, "run", "calibrate"):
        raise UsageError(
            f"no command '{args.topic}'{_did_you_mean(args.topic)}", hint="mpswrap help"
        )
    parser.parse_args([args.topic, "--help"])
    return 0


def _cmd_completion(args: argparse.Namespace) -> int:
    from . import completion

    print(completion.bash(build_parser()), end="")
    return 0


HANDLERS["help"] = _cmd_help
HANDLERS["completion"] = _cmd_completion
HANDLERS["sim"] = _cmd_sim


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging(None, "info")
    try:
        return dispatch(argv)
    except SystemExit as exc:  # --help, --version
        return int(exc.code or 0)
    except MpswrapError as exc:
        if "--debug" in argv or debug_env():
            log.exception("failed")
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug or an error no module translated: one line all the same
        log.debug("traceback", exc_info=exc)
        print(f"mpswrap: {internal_error(exc, 'with --debug')}", file=sys.stderr)
        return 1
