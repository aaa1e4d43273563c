"""``python -m mpswrap.slurm install|uninstall ...``: ``mpswrap install-hooks`` and
``mpswrap uninstall-hooks`` under the names an admin types where only the interpreter is at
hand; the same rows of the command table, parsed and run the same way."""

from __future__ import annotations

import sys

from ..cli.main import main as cli_main

#: This entrance's words, and the commands they are.
WORDS = {"install": "install-hooks", "uninstall": "uninstall-hooks"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(f"usage: python -m mpswrap.slurm {{install|uninstall}} ...\n\n{__doc__}")
        return 0
    if not argv or argv[0] not in WORDS:
        print(
            "mpswrap: python -m mpswrap.slurm takes install or uninstall\n"
            "hint: python -m mpswrap.slurm install --help",
            file=sys.stderr,
        )
        return 2
    return cli_main([WORDS[argv[0]], *argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
