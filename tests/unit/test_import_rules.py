"""Guard DESIGN.md's layering: one owner per outside world, imports only from below."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "mpswrap"

LAYER = {
    # Fractions order modules inside one DESIGN layer (paths uses errors; gpu uses jobenv).
    "errors": 0,
    "paths": 0.5,
    "config": 1,
    "jobenv": 1,
    "gpu": 1.5,
    "_proc": 1,
    "_lock": 1,
    "control": 2,
    "manifest": 2,
    "mpslog": 2,
    "daemon": 3,
    "client": 3,
    "slurmjob": 3,
    "node": 4,
    "hooks": 5,
    "launcher": 5.6,
    "supervisor": 5,
    "session": 5,
    "manage": 5,
    "localrun": 5.3,
    "demo": 5.5,
    "owner": 4.5,
    "launchargs": 1,
    "cli": 6,
    "__main__": 6,
    "__init__": 6,
}
OWNERS = {
    "subprocess": {"_proc"},
    "psutil": {"_proc"},
    "filelock": {"_lock"},
    "pynvml": {"gpu"},
    "mpi4py": {"session"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = node.module or ""
                names |= (
                    {f"mpswrap.{base}".rstrip(".")}
                    if base
                    else {f"mpswrap.{a.name}" for a in node.names}
                )
            else:
                names.add(node.module or "")
    return names


def test_layers_and_owners() -> None:
    problems = []
    for path in sorted(PKG.glob("*.py")):
        mod = path.stem
        assert mod in LAYER, f"{mod}.py has no layer in this test: place it in DESIGN's layers"
        for name in _imports(path):
            top = name.split(".")[0]
            if top in OWNERS and mod not in OWNERS[top]:
                problems.append(f"{mod} imports {top} (owner: {OWNERS[top]})")
            if name.startswith("mpswrap.") and not name.startswith("mpswrap.sim"):
                dep = name.split(".")[1]
                if dep != mod and dep in LAYER and LAYER[dep] >= LAYER[mod] and mod != "cli":
                    if mod not in ("__init__", "__main__") and dep != "cli":
                        problems.append(f"{mod} (L{LAYER[mod]}) imports {dep} (L{LAYER[dep]})")
                if dep == "cli" and mod != "__main__":
                    problems.append(f"{mod} imports cli")
    assert not problems, problems


def test_import_mpswrap_is_light() -> None:
    """Every rank, hook and ``import mpswrap`` pays for what is imported at start: NVML and
    MPI only where used; filelock only where a lock is taken (never by a rank that joins the
    prolog's daemons)."""
    code = (
        "import sys, mpswrap, mpswrap.cli, mpswrap.launcher, mpswrap.hooks; "
        "bad = [m for m in ('mpi4py', 'pynvml', 'filelock') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PKG.parent)
