"""Command line: ``mpswrap [options] WORD ...``. The first word after the launch options picks
the mode, the same way every time, before anything touches NVML or a daemon:

- a command of the table (``cli.commands``; two words for ``farm status``);
- a launcher (``srun``, ``mpirun``, ``torchrun``, ... ``job.launchers``): prefix mode;
- a program: a word with a ``/``, or one found on PATH; anything after ``--`` always is one
  (per-rank mode, ``srun mpswrap ./app``);
- anything else is a mistyped command: exit 2 with the nearest command named.

Options a command takes may come before or after its word; an option nobody takes is refused
with the nearest one named. ``main()`` parses and dispatches; the work lives in ``entry``.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from .. import __version__
from .._signals import Interrupted
from ..errors import GpuChoiceError, MpswrapError, UsageError, internal_error
from ..job.launchers import launcher_of
from . import commands, output
from .commands import COMMANDS, Command
from .logs import debug_env, setup_logging
from .nearest import did_you_mean
from .options import LAUNCHERS, MODES, VERBOSITY, WRAPPER_OPTIONS, add
from .output import Output, OutputError

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:
    from typing import NoReturn

__all__ = ["build_parser", "main", "parsers", "split_options"]

log = logging.getLogger("mpswrap")


class _Parser(argparse.ArgumentParser):
    """Usage errors as one ``mpswrap: ...`` line and a hint, exit 2; an unknown option names
    the nearest one the command takes."""

    _argv: Sequence[str] = ()

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._argv = self._joined(list(sys.argv[1:] if args is None else args))
        return super().parse_known_args(self._argv, namespace)

    def _joined(self, argv: list[str]) -> list[str]:
        """``--mem-limit -5G`` as ``--mem-limit=-5G``: argparse takes a value that starts
        with one ``-`` (and is no negative number) for an option and says only "expected one
        argument"; joined, the value is checked and named as every bad value is. A word of
        ``--`` stays an option (a typo of one is named as such)."""
        out: list[str] = []
        for at, word in enumerate(argv):
            if word == "--":
                return out + argv[at:]
            action = self._option_string_actions.get(out[-1]) if out else None
            takes = action is not None and action.nargs is None
            value = len(word) > 1 and word.startswith("-") and not word.startswith("--")
            if takes and value and not self._known(word):
                out[-1] = f"{out[-1]}={word}"
            else:
                out.append(word)
        return out

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            word = message[len(prefix) :].split(maxsplit=1)[0]
            if word.startswith("-"):
                raise unknown_option(word, self.prog, _flags(self))
            # as the simulator's commands say it (mpswrap/sim/__main__.py)
            raise UsageError(f"unexpected argument '{word}'", hint=f"{self.prog} --help")
        # argparse tells of a missing argument before an unknown option: that option first.
        unknown = [w for w in self._argv if w.startswith("--") and not self._known(w)]
        if unknown:
            raise unknown_option(unknown[0], self.prog, _flags(self))
        raise UsageError(_as_bad_value(message), hint=f"{self.prog} --help")

    def _known(self, word: str) -> bool:
        return word == "--" or word.split("=", 1)[0] in _flags(self)


#: argparse's words for a value not among an option's choices (3.11 to 3.13).
_CHOICE = re.compile(r"(argument [^:]+): invalid choice: (.*) \(choose from (.*)\)$")


def _as_bad_value(message: str) -> str:
    """A value not among an option's choices, said as every bad value is: ``argument
    --policy: invalid value 'x': expected one of block, cyclic, affinity``."""
    match = _CHOICE.match(message)
    if not match:
        return message
    value = match[2] if match[2].startswith("'") else repr(match[2])
    choices = [c.strip().strip("'") for c in match[3].split(",")]
    near = did_you_mean(value.strip("'"), choices)
    return f"{match[1]}: invalid value {value}: expected one of {', '.join(choices)}{near}"


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [f for action in parser._actions for f in action.option_strings]


def unknown_option(word: str, where: str, known: Sequence[str]) -> UsageError:
    """``unknown option '--polcy' (did you mean '--policy'?)`` for ``where``."""
    name = word.split("=", 1)[0]
    long = {k.lstrip("-"): k for k in known if k.startswith("--")}  # "--" alike in every one
    near = did_you_mean(name.lstrip("-"), list(long)) if name.startswith("--") else ""
    for bare, flag in long.items():
        near = near.replace(f"'{bare}'", f"'{flag}'")
    return UsageError(f"unknown option '{name}'{near}", hint=f"{where} --help")


def build_parser() -> argparse.ArgumentParser:
    """The parser of the launch modes: launch options and output options; its help lists
    the modes and every command of the table."""
    width = max(len(c.name) for c in COMMANDS)
    listing = "\n".join(f"  {c.name:<{width}}  {c.summary}" for c in COMMANDS)
    parser = _Parser(
        prog="mpswrap",
        usage=f"mpswrap [options] COMMAND ... | mpswrap [options] ({'|'.join(LAUNCHERS)})"
        " ... | mpswrap [options] [--] PROGRAM ...",
        description=f"{MODES}\n\ncommands:\n{listing}",
        epilog="'mpswrap help COMMAND' or 'mpswrap COMMAND --help' for a command's options. "
        "Settings (mpswrap config) come from MPSWRAP_<NAME> variables and the admin file.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add(
        parser.add_argument_group("launch options (prefix, per-rank and run modes)"),
        WRAPPER_OPTIONS,
    )
    add(parser.add_argument_group("output"), VERBOSITY)
    return parser


def parsers(simulator: bool = False) -> dict[str, argparse.ArgumentParser]:
    """Every parser: the launch modes' (``""``), then each command's, in the table's order
    (help, the man page, completion and docs/reference.md are made from these); with
    ``simulator``, then each ``sim`` command's (completion offers their options too)."""
    found = {"": build_parser(), **{c.name: commands.build(c, _Parser) for c in COMMANDS}}
    if simulator:
        from .simcmd import parsers as simulator_parsers

        found.update(simulator_parsers())
    return found


def split_options(
    argv: Sequence[str], parser: argparse.ArgumentParser
) -> tuple[list[str], list[str], bool]:
    """(options, the rest, whether ``--`` ended them): options end at the first positional
    word or ``--``; an option ``parser`` does not take is refused here, where a later word
    would otherwise be read as the mode (``--gpu 0 run``)."""
    valued = {f for a in parser._actions if a.nargs != 0 for f in a.option_strings}
    known = set(_flags(parser))
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--":
            return list(argv[:index]), list(argv[index + 1 :]), True
        if not word.startswith("-") or word == "-":
            break
        flag = word.split("=", 1)[0] if word.startswith("--") else word[:2]
        if flag not in known:
            raise unknown_option(word, parser.prog, sorted(known))
        attached = flag != word  # --gpus=0, -n4, -vv
        index += 2 if flag in valued and not attached else 1
    return list(argv[:index]), list(argv[index:]), False


def dispatch(argv: list[str]) -> int:
    """Parse ``argv`` and run the mode its first word picks."""
    top = build_parser()
    try:
        head, rest, dashdash = split_options(argv, top)
    except UsageError:
        found = _command_after_options(argv)
        if found is None:
            raise
        head, rest, dashdash = argv[: found[1]], argv[found[1] :], False
    cmd = None if dashdash else commands.words_of(rest)
    if cmd is not None:
        return _run_command(cmd, head, rest[len(cmd.name.split()) :])
    args = top.parse_args(head)
    if not rest:
        if dashdash:
            raise UsageError("no program given after --", hint="mpswrap --help")
        top.print_help()
        raise UsageError("no command, launcher or program given", hint="mpswrap --help")
    word = rest[0]
    if not dashdash and launcher_of(word):
        setup_logging(args, "info")
        from ..entry.launch import prefix
        from ..job.run import LaunchOptions

        with _gpus_at_fault(args):
            return prefix(LaunchOptions.of(args), rest)
    if not (dashdash or "/" in word or shutil.which(word)):
        raise UsageError(
            f"unknown command '{word}'{did_you_mean(word, _words())}",
            hint="mpswrap help lists the commands; to run a program, give its path "
            f"or use 'mpswrap -- {word}'",
        )
    # One rank of many: "daemon already running" from every rank is noise at 48 ranks a GPU.
    setup_logging(args, "warning")
    from ..entry.launch import per_rank
    from ..job.run import LaunchOptions
    from ..job.supervise import check_program

    opts = LaunchOptions.of(args)  # usage errors (2) first, then 127/126, before NVML or a daemon
    check_program(rest, os.environ)
    with _gpus_at_fault(args):
        return per_rank(opts, rest)


def _command_after_options(argv: list[str]) -> tuple[Command, int] | None:
    """The command whose word follows options only it takes (``--per-gpu 2 farm t.txt``),
    and its word's place; None when there is none."""
    for at in range(len(argv)):
        if argv[at] == "--":
            return None
        cmd = commands.words_of(argv[at:])
        if cmd is None:
            continue
        try:
            head, _, _ = split_options(argv[:at], commands.build(cmd, _Parser))
        except UsageError:
            continue
        if len(head) == at:
            return cmd, at
    return None


def _run_command(cmd: Command, head: list[str], tail: list[str]) -> int:
    """Parse a command's words (those before its name too) with its own parser, and run it:
    ``run`` and ``calibrate`` take their options, then ``--`` and the program."""
    parser = commands.build(cmd, _Parser)
    program: list[str] = []
    if cmd.program:
        tail, program, _ = split_options(tail, parser)
    args = parser.parse_args([*head, *tail])
    args.command, args.program = cmd.name, program
    setup_logging(args, "info")
    with _gpus_at_fault(args):
        return commands.invoke(cmd.name, args)


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


def _words() -> list[str]:
    return [*(c.name for c in COMMANDS if " " not in c.name), *LAUNCHERS]


# --- the commands the CLI itself answers ----------------------------------------------------
def cmd_help(args: argparse.Namespace) -> int:
    if args.man_path:
        from . import manpage

        if args.topic:
            raise UsageError(
                f"unexpected argument {args.topic[0]!r}", hint="mpswrap help --man-path"
            )

        print(manpage.shipped())
        return 0
    if not args.topic:
        build_parser().print_help()
        return 0
    name = " ".join(args.topic)
    if name in LAUNCHERS:  # prefix mode: the overview tells it, with the launch options
        build_parser().print_help()
        return 0
    if args.topic[0] == "sim" and len(args.topic) == 2:  # the simulator's own commands
        from .simcmd import print_help

        return print_help(args.topic[1])
    if name not in {c.name for c in COMMANDS}:
        near = did_you_mean(name, [c.name for c in COMMANDS])
        raise UsageError(f"no command '{name}'{near}", hint="mpswrap help")
    commands.build(commands.command_named(name), _Parser).print_help()
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    from . import completion

    print(completion.bash(parsers(simulator=True)), end="")
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    print(f"mpswrap {__version__}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging(None, "info")
    # Started with standard output closed (``>&-``): a write fails as on a full disk.
    stdout, sys.stdout = sys.stdout, Output(sys.stdout or output.Closed())
    try:
        return _main(argv)
    finally:
        sys.stdout = stdout


def _main(argv: list[str]) -> int:
    """Run ``argv``; each way it can fail as one line and its exit code."""
    try:
        return _flushed(argv)
    except OutputError as exc:  # no second try at writing what could not be written
        output.discard()
        output.to_stderr(exc.render())
        return exc.exit_code
    except MpswrapError as exc:
        if ("--debug" in argv or debug_env()) and not isinstance(exc, UsageError):
            log.debug("traceback", exc_info=exc)  # where it failed (a usage error: no news)
        output.to_stderr(exc.render())
        return exc.exit_code
    except (Interrupted, KeyboardInterrupt) as exc:  # Interrupted: its own cleanup ran first
        return 128 + (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)
    except BrokenPipeError:
        return output.closed()
    except Exception as exc:  # a bug or an error no module translated: one line all the same
        log.debug("traceback", exc_info=exc)
        output.to_stderr(f"mpswrap: {internal_error(exc, 'with --debug')}")
        return 1


def _flushed(argv: list[str]) -> int:
    """The exit code of ``argv``'s command, its output written out (flushed here, where a
    failure to write it is still reported, not at the interpreter's exit)."""
    try:
        code = dispatch(argv)
    except SystemExit as exc:  # --help, --version
        code = int(exc.code or 0)
    sys.stdout.flush()
    return code
