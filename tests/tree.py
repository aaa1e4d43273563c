"""The tree under test: the repository checkout the tests run from, and the mpswrap package
they test, which need not lie in it (CI installs the built wheel and runs the tests from a
copy of the checkout without its ``mpswrap/``)."""

from __future__ import annotations

from pathlib import Path

import mpswrap

#: The checkout: docs, examples, benchmarks, slurm/README.md, tools and the tests themselves.
#: ``PYTHONPATH=REPO`` lets a child process import ``tests`` (and this tree's mpswrap, when
#: the checkout has one: never another than the tests import).
REPO = Path(__file__).resolve().parents[1]
#: The mpswrap package under test: its files (the hook shim, install.sh, its sources) are
#: read here, never under REPO.
PACKAGE = Path(mpswrap.__file__).resolve().parent
