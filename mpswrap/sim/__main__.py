"""``python -m mpswrap.sim install-bin DIR [--faults FILE]`` | ``inventory FILE [--gpus N]``
(``mpswrap sim ...`` runs the same with mpswrap's own interpreter)."""

from __future__ import annotations

import argparse
import sys

from . import install_bin
from .inventory import write_inventory

#: The commands, in the order ``--help`` lists them.
COMMANDS = ("install-bin", "inventory")


def main(argv: list[str] | None = None, prog: str = "python -m mpswrap.sim") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    bins = sub.add_parser(COMMANDS[0], help="write nvidia-cuda-mps-control, mps-sim-client")
    bins.add_argument("dir")
    bins.add_argument("--faults", default=None, help="fault file (MPSWRAP_SIM_FAULTS)")
    inv = sub.add_parser(COMMANDS[1], help="write a fake NVML inventory (JSON)")
    inv.add_argument("file")
    inv.add_argument("--gpus", type=int, default=2)
    args = parser.parse_args(argv)
    if args.cmd == COMMANDS[0]:
        print(install_bin(args.dir, faults=args.faults))
    else:
        print(write_inventory(args.file, args.gpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
