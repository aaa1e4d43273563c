"""``python -m mpswrap``: the same as the ``mpswrap`` command.

The Slurm hooks' shims run ``python -I -m mpswrap <hook>`` for every job on every node: that
exact form runs the hook's row of the command table straight away, without building a parser
or importing what only the other commands need (docs/benchmarks.md, the prolog's start).
"""

import sys

from .cli.commands import HOOKS, invoke

if len(sys.argv) == 2 and sys.argv[1] in HOOKS:
    from types import SimpleNamespace

    try:
        code = invoke(sys.argv[1], SimpleNamespace(command=sys.argv[1], config=None))
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:  # e.g. a broken install: one line, as ``main()`` prints it
        from .errors import internal_error

        print(f"mpswrap: {internal_error(exc, 'with --debug')}", file=sys.stderr)
        code = 1
    sys.exit(code)

from .cli.main import main

sys.exit(main())
