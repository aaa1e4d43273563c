"""``python -m mpswrap.sim install-bin DIR [--faults FILE]`` | ``inventory FILE [--gpus N]``
(``mpswrap sim ...`` runs the same with mpswrap's own interpreter)."""

from __future__ import annotations

import argparse
import sys

from . import install_bin
from ._common import number
from .inventory import write_inventory

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:
    from typing import NoReturn

__all__ = ["COMMANDS", "MOST_GPUS", "ArgumentError", "main", "parse", "run"]

#: The commands, in the order ``--help`` lists them.
COMMANDS = ("install-bin", "inventory")
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


def parse(argv: list[str] | None, prog: str = "python -m mpswrap.sim") -> argparse.Namespace:
    """The parsed command line; ArgumentError when it is bad."""
    parser = _Parser(prog=prog, description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    bins = sub.add_parser(COMMANDS[0], help="write nvidia-cuda-mps-control, mps-sim-client")
    bins.add_argument("dir")
    bins.add_argument("--faults", default=None, help="fault file (MPSWRAP_SIM_FAULTS)")
    inv = sub.add_parser(COMMANDS[1], help="write a fake NVML inventory (JSON)")
    inv.add_argument("file")
    inv.add_argument(
        "--gpus",
        type=number(MOST_GPUS, least=1, whole=True),
        default=2,
        help=f"1 to {MOST_GPUS} (default: 2)",
    )
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    if args.cmd == COMMANDS[0]:
        print(install_bin(args.dir, faults=args.faults))
    else:
        print(write_inventory(args.file, args.gpus))
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m mpswrap.sim") -> int:
    """Exit 2 with one line (and a hint) on a bad command line."""
    try:
        args = parse(argv, prog)
    except ArgumentError as exc:
        print(f"{prog}: {exc}\nhint: {exc.prog} --help", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
