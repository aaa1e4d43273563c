"""``python -m mpswrap.slurm install|uninstall ...``: the same as ``mpswrap install-hooks`` and
``mpswrap uninstall-hooks``, for a node where only the interpreter is at hand."""

from __future__ import annotations

import argparse
import sys

from ..errors import MpswrapError
from .install import add_install_arguments, add_uninstall_arguments, install, uninstall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpswrap.slurm", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_install_arguments(sub.add_parser("install", help="install the Slurm hook shims"))
    add_uninstall_arguments(sub.add_parser("uninstall", help="remove the Slurm hook shims"))
    args = parser.parse_args(argv)
    try:
        return install(args) if args.cmd == "install" else uninstall(args)
    except MpswrapError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
