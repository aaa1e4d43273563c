"""The commit a benchmark ran, and whether the tree differed from it, for its results file.

    python benchmarks/revision.py    # MPS_RESULTS_COMMIT=<sha> MPS_RESULTS_DIRTY=<0|1>, for a copy

The GPU machine gets a copy of the working tree without ``.git``: pass the two variables this
prints in its command, and the results name the checkout they came from.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: Where the benchmarks write; a results file being filled does not make the code dirty.
RESULTS = "benchmarks/results"


def _git(root: Path, *args: str) -> str:
    res = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30, check=True
    )
    return res.stdout.strip()


def revision(root: Path = REPO, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """``{"commit": sha, "dirty": bool}``: from MPS_RESULTS_COMMIT and MPS_RESULTS_DIRTY when set,
    else from git where ``root`` is a checkout, else "unknown"."""
    if environ.get("MPS_RESULTS_COMMIT"):
        dirty = environ.get("MPS_RESULTS_DIRTY", "")
        known = dirty in ("0", "1")
        return {
            "commit": environ["MPS_RESULTS_COMMIT"],
            "dirty": dirty == "1" if known else "unknown",
        }
    if not (root / ".git").exists():
        return {"commit": "unknown", "dirty": "unknown"}
    try:
        commit = _git(root, "rev-parse", "HEAD")
        changes = _git(root, "status", "--porcelain", "--", ".", f":!{RESULTS}")
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": "unknown"}
    return {"commit": commit, "dirty": bool(changes)}


def tree_revision(tree: Path) -> dict[str, Any]:
    """``revision`` of one tree an A/B benchmark measures: this checkout's (the variables
    apply: on the GPU machine its copy's own ``.git`` may name another commit), or another
    checkout's own."""
    mine = tree.resolve() == REPO.resolve()
    return revision(tree, environ=os.environ if mine else {})


def main() -> int:
    rev = revision(environ={})
    dirty = {True: "1", False: "0"}.get(rev["dirty"], "unknown")
    print(f"MPS_RESULTS_COMMIT={rev['commit']} MPS_RESULTS_DIRTY={dirty}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
