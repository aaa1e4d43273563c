"""``python -m mpswrap``: the same as the ``mpswrap`` command.

The Slurm hooks' shims run ``python -I -m mpswrap <hook>`` for every job on every node: that
exact form goes straight to the hook, without building the CLI's parser or importing what only
the commands need (docs/benchmarks.md, the prolog's start).
"""

import sys

from .cli.options import HOOK_COMMANDS

if len(sys.argv) == 2 and sys.argv[1] in HOOK_COMMANDS:
    from .entry.hooks import run_hook

    sys.exit(run_hook(sys.argv[1]))

from .cli.main import main

sys.exit(main())
