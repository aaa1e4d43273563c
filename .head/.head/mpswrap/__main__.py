"""``python -m mpswrap``: the same as the ``mpswrap`` command.

The Slurm hooks' shims run ``python -I -m mpswrap <hook>`` for every job on every node: that
exact form goes straight to the hook, without building the CLI's parser or importing what only
the commands need (docs/benchmarks.md, the prolog's start).
"""

import sys

from .cli.options import HOOK_COMMANDS

if len(sys.argv) == 2 and sys.argv[1] in HOOK_COMMANDS:
    try:
        from .entry.hooks import run_hook

        code = run_hook(sys.argv[1])
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:  # e.g. a broken install: one line, as ``main()`` prints it
        from .errors import internal_error

        print(f"mpswrap: {internal_error(exc, 'with --debug')}", file=sys.stderr)
        code = 1
    sys.exit(code)

from .cli.main import main

sys.exit(main())
