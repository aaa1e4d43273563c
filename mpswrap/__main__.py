"""``python -m mpswrap``: the same as the ``mpswrap`` command."""

import sys

from .cli.main import main

sys.exit(main())
