"""``mpswrap sim COMMAND ...``: the MPS simulator's own command line (``mpswrap/sim/__main__.py``)
run by the interpreter that runs mpswrap. ``python3 -m mpswrap.sim`` needs a ``python3`` that
has mpswrap; a link to a virtual environment's ``bin/mpswrap`` (the README's install) or the
module's ``mpswrap`` command has none on ``PATH``, and this command works wherever ``mpswrap``
does. The simulator's programs it writes run this interpreter too."""

from __future__ import annotations

import argparse

from ..errors import UsageError

__all__ = ["add_arguments", "cmd_sim", "parsers", "print_help"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``sim``'s two arguments: the simulator's command, then what that command takes
    (passed on untouched, ``--help`` too)."""
    from ..sim.__main__ import COMMANDS

    p.add_argument(
        "sim_command",
        metavar="COMMAND",
        choices=COMMANDS,
        help=f"the simulator's command: {' or '.join(COMMANDS)} (required)",
    )
    rest = p.add_argument(
        "sim_args",
        nargs=argparse.REMAINDER,
        default=[],
        metavar="ARGS",
        help="that command's arguments; COMMAND --help lists them (default: none)",
    )
    rest.required = False  # argparse counts a REMAINDER as required, and says so


#: The output options every command takes anywhere on its line (they set mpswrap's log
#: level, taken before the simulator's words are parsed): none is the simulator's.
OUTPUT_WORDS = frozenset({"-v", "--verbose", "-q", "-qq", "--quiet", "--debug"})


def cmd_sim(args: argparse.Namespace) -> int:
    """A bad command line of the simulator's, or a path it cannot write, is one ``mpswrap:``
    line and a hint, exit 2, as every command's."""
    from ..sim.__main__ import ArgumentError, cannot_write, parse, write

    if "--version" in args.sim_args:
        from .. import __version__

        print(f"mpswrap {__version__}")
        return 0
    words = [w for w in args.sim_args if w not in OUTPUT_WORDS]
    try:
        parsed = parse([args.sim_command, *words], prog="mpswrap sim")
    except ArgumentError as exc:
        raise UsageError(str(exc), hint=f"{exc.prog} --help") from None
    try:
        written = write(parsed)
    except OSError as exc:  # a path the user gave: as a bad value, exit 2
        line, hint = cannot_write(parsed, exc)
        raise UsageError(line, hint=hint) from exc
    print(written)
    return 0


def print_help(command: str) -> int:
    """``mpswrap help sim COMMAND``: that command's help, as ``mpswrap sim COMMAND --help``."""
    from ..sim.__main__ import COMMANDS, parse
    from .nearest import did_you_mean

    if command not in COMMANDS:
        near = did_you_mean(f"sim {command}", [f"sim {c}" for c in COMMANDS])
        raise UsageError(f"no command 'sim {command}'{near}", hint="mpswrap help sim")
    try:
        parse([command, "--help"], prog="mpswrap sim")
    except SystemExit:  # argparse's --help: printed
        pass
    return 0


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Each simulator command's parser as ``sim COMMAND`` (completion offers its options)."""
    from ..sim.__main__ import build

    return {f"sim {name}": parser for name, parser in build("mpswrap sim")[1].items()}
