"""Guard DESIGN.md's architecture: layers as folders, one owner per outside world, small
modules and functions."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.tree import PACKAGE

#: Layers, lowest first, each a folder; inside one, a module imports only those listed before
#: it (the order is the layer's own).
LAYERS: dict[str, tuple[str, ...]] = {
    "": (
        "_struct",
        "errors",
        "fields",
        "paths",
        "trust",
        "values",
        "config",
        "jobenv",
        "_proc",
        "_wait",
        "removal",
        "_cgroup",
        "_signals",
        "_lock",
    ),
    "mps": (
        "inventory_cache",
        "gpu",
        "cuda",
        "control",
        "mpslog",
        "manifest",
        "record",
        "rootrecord",
        "identity",
        "start",
        "ladder",
        "daemon",
    ),
    # Everything Slurm: its GPU numbers, scontrol and job facts, the hook shims' installer.
    "slurm": ("gpus", "scontrol", "install"),
    "job": (
        "state",
        "containers",
        "launchers",
        "launchargs",
        "placement",
        "verify",
        "outcomes",
        "owners",
        "supervise",
        "job",
        "attached",
        "exclusive",
        "watchdog",
        "run",
    ),
    # The task farm: its tasks, K, memory admission, the journal and its views.
    "taskfarm": (
        "tasks",
        "journal",
        "joblog",
        "faultwatch",
        "packing",
        "fold",
        "admission",
        "sizing",
        "controls",
        "tee",
        "lanes",
        "profile",
        "taskproc",
        "recorder",
        "words",
        "view",
        "engine",
        "tasktotals",
        "status",
    ),
    "report": ("summary", "metrics", "status", "plots"),
    "entry": (
        "hooks",
        "launch",
        "local",
        "farm",
        "farmstatus",
        "calibrate",
        "session",
        "manage",
        "demo",
    ),
    "cli": (
        "options",
        "nearest",
        "simcmd",
        "commands",
        "logs",
        "output",
        "farmcmd",
        "completion",
        "manpage",
        "main",
    ),
}
#: The package's faces, its entrances: they may import any layer (``session``, ``main``),
#: nothing imports them.
FACES = {"__init__", "__main__", "slurm.__main__"}
OWNERS = {
    "subprocess": {"_proc"},
    "psutil": {"_proc"},
    "filelock": {"_lock"},
    "pynvml": {"mps.gpu"},
    "mpi4py": {"entry.session"},
}
#: Levels a concept-sized module or function never meets: past them, it holds a second
#: concept. They catch a grab-bag; they are not a budget to pack code under (the formatter
#: formats, and modules are split by concept).
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    """Dotted name under mpswrap (``job.job``) -> file, outside the simulator."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        if rel.parts[0] == "sim" or (rel.name == "__init__" and len(rel.parts) > 1):
            continue
        out[".".join(rel.parts)] = path
    return out


def _rank(name: str) -> tuple[int, int] | None:
    """(layer, position inside it) of a module, None for the package faces."""
    folder, _, mod = name.rpartition(".")
    if name in FACES:
        return None
    order = list(LAYERS)
    assert folder in LAYERS, f"mpswrap/{folder} is no layer of DESIGN.md"
    assert mod in LAYERS[folder], f"{name} has no place in its layer: add it to LAYERS"
    return order.index(folder), LAYERS[folder].index(mod)


def _imports(name: str, path: Path) -> set[str]:
    """Absolute dotted names of what ``name`` imports (``mpswrap.x.y`` or a top module)."""
    package = name.rpartition(".")[0].split(".") if "." in name else []
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found |= {f"{node.module}.{a.name}" for a in node.names} | {node.module or ""}
        elif isinstance(node, ast.ImportFrom):
            base = ["mpswrap", *package[: len(package) - node.level + 1]]
            base += (node.module or "").split(".") if node.module else []
            found |= {".".join([*base, a.name]) for a in node.names}
    return found


def _target(imported: str, modules: dict[str, Path]) -> str | None:
    """The mpswrap module an import names (``mpswrap.job.job.attach`` -> ``job.job``)."""
    parts = imported.split(".")[1:]
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or None


def test_layers_are_folders_and_imports_only_go_down() -> None:
    modules = _modules()
    problems = []
    for name, path in modules.items():
        mine = _rank(name)
        for imported in _imports(name, path):
            top = imported.split(".")[0]
            if top in OWNERS and name not in OWNERS[top]:
                problems.append(f"{name} imports {top} (its owner: {OWNERS[top]})")
            if top != "mpswrap" or imported.startswith("mpswrap.sim"):
                continue
            dep = _target(imported, modules)
            if dep is None or dep == name:
                continue
            if dep.startswith("cli.") and not name.startswith("cli.") and name not in FACES:
                problems.append(f"{name} imports {dep}: nothing imports cli")
            theirs = _rank(dep)
            if mine is not None and (theirs is None or theirs >= mine):
                problems.append(f"{name} {mine} imports {dep} {theirs}: not below it")
    assert not problems, "\n".join(problems)


def test_the_simulator_stands_alone() -> None:
    for path in (PACKAGE / "sim").rglob("*.py"):
        name = "sim." + ".".join(path.relative_to(PACKAGE / "sim").with_suffix("").parts)
        outside = [i for i in _imports(name, path) if i.startswith("mpswrap.")]
        outside = [i for i in outside if not i.startswith("mpswrap.sim")]
        assert not outside, f"{path} imports {outside}"


#: The one module of the layers that knows the simulator: ``mpswrap demo`` installs it.
SIMULATOR_USERS = {"entry.demo", "cli.simcmd"}


def test_production_code_does_not_know_the_simulator() -> None:
    """The simulator stands behind the interfaces the real driver has (the control program,
    the inventory file and its memory folder, NVML's figures): only the demo installs it."""
    knowing = {
        name
        for name, path in _modules().items()
        if any(i.startswith("mpswrap.sim") for i in _imports(name, path))
    }
    assert knowing == SIMULATOR_USERS


def test_no_module_or_function_holds_two_concepts() -> None:
    problems = []
    for name, path in _modules().items():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            problems.append(f"{name}: {text.count(chr(10))} lines > {MAX_MODULE_LINES}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    problems.append(f"{name}.{node.name}: {length} lines")
    assert not problems, "\n".join(problems)


def test_an_upward_import_is_caught(tmp_path: Path) -> None:
    """The rule itself: a mps module importing from job is reported."""
    bad = tmp_path / "daemon.py"
    bad.write_text("from ..job.job import JobDaemons\n")
    imported = _imports("mps.daemon", bad)
    assert _target(next(iter(imported)), _modules()) == "job.job"
    assert _rank("job.job") > _rank("mps.daemon")  # type: ignore[operator]


def test_import_mpswrap_is_light() -> None:
    """Every rank, hook and ``import mpswrap`` pays for what is imported at start: NVML and
    MPI only where used; filelock only where a lock is taken (never by a rank that joins the
    prolog's daemons)."""
    code = (
        "import sys, mpswrap, mpswrap.cli.main, mpswrap.entry.launch, mpswrap.entry.hooks; "
        "bad = [m for m in ('mpi4py', 'pynvml', 'filelock') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


def test_the_rank_start_path_is_lean() -> None:
    """What every rank's ``mpswrap ./app`` imports before its program starts leaves out what
    only the commands use (their help texts, the man page, completion, close-match search),
    what only a teardown uses (the ladder, the MPS log's reader, the job's record),
    ``typing`` and ``dataclasses`` (docs/concepts.md, What a start imports)."""
    code = (
        "import sys, mpswrap.cli.main, mpswrap.entry.launch; "
        "bad = [m for m in ('difflib', "
        "'mpswrap.cli.manpage', 'mpswrap.cli.completion', 'mpswrap.cli.farmcmd', "
        "'mpswrap.mps.ladder', 'mpswrap.mps.mpslog', 'mpswrap.mps.record', 'typing', "
        "'dataclasses', 'inspect') "
        "if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


def test_the_hooks_start_path_is_lean() -> None:
    """What the shims' ``python -I -m mpswrap <hook>`` imports before the hook runs: not the
    CLI (its parser and the commands' modules), not the launcher or session(), not psutil
    (process identity comes from /proc), not importlib.resources, not ``typing`` or
    ``dataclasses``, and not syslog's handler before a hook asks for it."""
    code = (
        "import sys, runpy; sys.argv = ['mpswrap', 'prolog']; "
        "import mpswrap.entry.hooks as h; h.run_hook = lambda *a: 0; "
        "runpy.run_module('mpswrap', run_name='__main__')"
    )
    probe = (
        "import atexit, sys; atexit.register(lambda: print(sorted(m for m in ("
        "'argparse', 'psutil', 'pynvml', 'filelock', 'importlib.resources', 'mpswrap.cli.main', "
        "'mpswrap.entry.launch', 'mpswrap.entry.session', 'typing', 'dataclasses', 'inspect', "
        "'logging.handlers') if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", f"{probe}; {code}"],
        capture_output=True,
        text=True,
        cwd=PACKAGE.parent,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_hook_commands_are_the_hooks() -> None:
    from mpswrap.cli.commands import HOOKS as COMMANDS
    from mpswrap.entry.hooks import HOOKS

    assert set(COMMANDS) == set(HOOKS)
