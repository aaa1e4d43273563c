"""The mpswrap wheel under test: the one CI built (``MPS_TEST_WHEEL``: the python tier runs
from a tree without ``mpswrap/``), else one built from this tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.tree import REPO

__all__ = ["wheel_under_test"]


def wheel_under_test(out: Path) -> Path:
    """CI's wheel, or one built from this tree into ``out``."""
    given = os.environ.get("MPS_TEST_WHEEL")
    if given:
        return Path(given).resolve()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
        check=True,
        timeout=300,
    )
    return next(out.glob("mpswrap-*.whl"))
