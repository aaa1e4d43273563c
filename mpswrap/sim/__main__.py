"""``python -m mpswrap.sim install-bin DIR [--faults FILE]`` | ``inventory FILE [--gpus N]``
(``mpswrap sim ...`` runs the same with mpswrap's own interpreter)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import install_bin
from ._common import number, path
from .inventory import write_inventory

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:
    from typing import Any, NoReturn

__all__ = [
    "COMMANDS",
    "MOST_GPUS",
    "WHAT",
    "ArgumentError",
    "build",
    "cannot_write",
    "main",
    "parse",
    "write",
]

#: The commands, in the order ``--help`` lists them.
COMMANDS = ("install-bin", "inventory")
#: What each command writes, as an error names it ("cannot write <it> (<path>): <why>"), and
#: what the user can do.
WHAT = {
    COMMANDS[0]: ("the simulator's programs", "give a directory you can write, e.g. ~/mps-sim"),
    COMMANDS[1]: ("the GPU inventory", "give a file you can write, e.g. ~/mps-sim/gpus.json"),
}
#: The most GPUs a fake inventory lists: more than any node has.
MOST_GPUS = 64


class ArgumentError(ValueError):
    """A bad command line: argparse's message, and the parser (``prog``) whose help tells."""

    def __init__(self, message: str, prog: str) -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ArgumentError(message, self.prog)


def build(prog: str = "python -m mpswrap.sim") -> tuple[argparse.ArgumentParser, dict[str, Any]]:
    """The parser, and each command's own by name (completion offers their options)."""
    parser = _Parser(prog=prog, description=__doc__, allow_abbrev=False)
    sub = parser.add_subparsers(dest="cmd", required=True)
    bins = sub.add_parser(
        COMMANDS[0],
        help="write nvidia-cuda-mps-control, mps-sim-client",
        description="Write the simulated nvidia-cuda-mps-control and mps-sim-client into DIR "
        "(made if missing); point control_binary (MPSWRAP_CONTROL_BINARY) at the first.",
        allow_abbrev=False,
    )
    bins.add_argument("dir", metavar="DIR", type=path, help="where to write them")
    bins.add_argument("--faults", metavar="FILE", type=path, help="fault file (MPSWRAP_SIM_FAULTS)")
    inv = sub.add_parser(
        COMMANDS[1],
        help="write a fake NVML inventory (JSON)",
        description="Write a fake list of GPUs to FILE; point gpu_inventory "
        "(MPSWRAP_GPU_INVENTORY) at it.",
        allow_abbrev=False,
    )
    inv.add_argument("file", metavar="FILE", type=path, help="the JSON file to write")
    inv.add_argument(
        "--gpus",
        type=number(MOST_GPUS, least=1, whole=True),
        default=2,
        help=f"1 to {MOST_GPUS} (default: 2)",
    )
    return parser, dict(sub.choices)


def parse(argv: list[str] | None, prog: str = "python -m mpswrap.sim") -> argparse.Namespace:
    """The parsed command line; ArgumentError when it is bad: an option the command does not
    take is named as one (with the nearest it takes), and its help is the command's."""
    parser, commands = build(prog)
    try:
        return parser.parse_args(argv)
    except ArgumentError as exc:
        command = commands.get((argv or sys.argv[1:] or [""])[0])
        if command is None or not str(exc).startswith("unrecognized arguments: "):
            raise
        raise _unknown(str(exc).split(": ", 1)[1].split()[0], command) from None


def _unknown(word: str, command: argparse.ArgumentParser) -> ArgumentError:
    """A word ``command`` does not take, as every mpswrap command names one."""
    import difflib

    if not word.startswith("-"):
        return ArgumentError(f"unexpected argument '{word}'", command.prog)
    taken = [o for a in command._actions for o in a.option_strings]
    near = difflib.get_close_matches(word, taken, n=1)
    guess = f" (did you mean '{near[0]}'?)" if near else ""
    return ArgumentError(f"unknown option '{word}'{guess}", command.prog)


def write(args: argparse.Namespace) -> Path:
    """Write what the command writes; its path. OSError when it cannot."""
    if args.cmd == COMMANDS[0]:
        return install_bin(args.dir, faults=args.faults)
    return write_inventory(args.file, args.gpus)


def cannot_write(args: argparse.Namespace, exc: OSError) -> tuple[str, str]:
    """(the one line, the hint) for a write ``exc`` stopped: a file that exists where a
    directory must be is "not a directory", not "File exists"."""
    what, hint = WHAT[args.cmd]
    given = args.dir if args.cmd == COMMANDS[0] else args.file
    where = exc.filename if isinstance(exc.filename, str) else given
    why = "Not a directory" if isinstance(exc, FileExistsError) else exc.strerror or str(exc)
    return f"cannot write {what} ({where}): {why}", hint


def main(argv: list[str] | None = None, prog: str = "python -m mpswrap.sim") -> int:
    """Exit 2 with one line (and a hint) on a bad command line."""
    try:
        args = parse(argv, prog)
    except ArgumentError as exc:
        print(f"{prog}: {exc}\nhint: {exc.prog} --help", file=sys.stderr)
        return 2
    try:
        written = write(args)
    except OSError as exc:
        line, hint = cannot_write(args, exc)
        print(f"{prog}: {line}\nhint: {hint}", file=sys.stderr)
        return 2
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
