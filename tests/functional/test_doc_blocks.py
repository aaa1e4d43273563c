"""Every runnable shell block of the README and docs/ runs as shown, on the MPS simulator.

Marking (tests/docblocks.py): ``<!-- runnable -->`` before a fenced block, ``<!-- output -->``
before the block that shows what it prints. Where each tag runs:

- no tag and ``setup``: here, on the simulator (functional tier);
- ``mpi``: here as well, with Open MPI's ``mpirun`` and mpi4py (Debian's, through the venv's
  system site packages); the document's test is then marked ``mpi``;
- ``admin``: slurm/README.md only (the admin guide), run by the integration tier under a real
  Slurm; a block needing a GPU or a real Slurm elsewhere stays unmarked (nothing runs it).

Each document runs as one bash session in a fresh directory that stands in for a clone of the
repository (``examples/`` is copied there) with ``HOME`` inside it; every other document
first runs the tutorial's ``setup`` blocks, so it starts where the tutorial's step 1 left
off. ``mpswrap`` on ``PATH`` is the tree under test (``python -m mpswrap``). What the test
adds to the environment, and the reader's does not need: run directories inside the session
directory (isolation from other tests), unbuffered Python output (a terminal's line order),
and for ``mpirun`` as root in CI: permission to run as root and to oversubscribe two cores.
Nothing a document starts may outlive it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.docblocks import TAGS, Block, doc_env, problems, run_blocks, runnable_blocks
from tests.simenv import SimNode, finish_sim_node
from tests.tree import REPO

pytestmark = pytest.mark.functional

TUTORIAL = REPO / "docs" / "tutorial.md"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: Documents whose commands another test runs or generates.
OTHER_TIERS = {
    "docs/reliability.md": "tests/functional/test_bad_input.py",
    "docs/benchmarks.md": "tests/unit/test_docs_figures.py",
}
#: The documents whose blocks run here: every one with a runnable block that no other test
#: runs. One with none has nothing to run (the drift checks still read it): no case of its own.
RUN_HERE = [d for d in DOCS if runnable_blocks(d) and str(d.relative_to(REPO)) not in OTHER_TIERS]


def _blocks(doc: Path) -> list[Block]:
    blocks = runnable_blocks(doc)
    for block in blocks:
        assert block.tag in TAGS and block.tag != "admin", f"{block.where}: tag {block.tag!r}"
    if doc == TUTORIAL:
        return blocks
    return [b for b in runnable_blocks(TUTORIAL) if b.tag == "setup"] + blocks


def _param(doc: Path) -> object:
    mpi = any(b.tag == "mpi" for b in runnable_blocks(doc))
    return pytest.param(doc, id=str(doc.relative_to(REPO)), marks=[pytest.mark.mpi] if mpi else [])


def _session(root: Path, mpi: bool) -> dict[str, str]:
    shim = root / "bin" / "mpswrap"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m mpswrap "$@"\n')
    shim.chmod(0o755)
    (root / "home").mkdir()
    shutil.copytree(REPO / "examples", root / "clone" / "examples")
    extra = {
        "HOME": str(root / "home"),
        "PATH": f"{shim.parent}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "MPSWRAP_RUN_DIR": str(root / "run"),
        "MPSWRAP_USER_RUN_DIR": str(root / "user"),
    }
    if mpi:
        extra.update(
            OMPI_ALLOW_RUN_AS_ROOT="1",
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
            OMPI_MCA_rmaps_base_oversubscribe="1",
            OMPI_MCA_plm_rsh_agent="false",  # one node: no ssh needed (or installed)
        )
    env = doc_env(extra)
    env.pop("XDG_RUNTIME_DIR", None)
    return env


@pytest.mark.timeout(600)
@pytest.mark.parametrize("doc", [_param(d) for d in RUN_HERE])
def test_runnable_blocks_run_as_shown(doc: Path) -> None:
    blocks = _blocks(doc)
    mpi = any(b.tag == "mpi" for b in blocks)
    if mpi:
        assert shutil.which("mpirun"), "Open MPI's mpirun is needed (tools/test.sh installs it)"
    root = Path(tempfile.mkdtemp(prefix="mpsw-doc-", dir="/tmp"))  # short: socket paths
    try:
        env = _session(root, mpi)
        done = run_blocks(blocks, env, root / "clone", root / "state.sh", timeout=180)
    finally:
        left = finish_sim_node(SimNode(root))
    found = problems(done, blocks)
    assert not found, "\n\n".join(found)
    assert not left, f"{doc.name} left processes behind: {left}"


def test_every_doc_is_run_here_or_by_another_tier() -> None:
    for other, test in OTHER_TIERS.items():
        assert (REPO / other).exists() and (REPO / test).exists(), (other, test)
    assert runnable_blocks(TUTORIAL)[0].tag == "setup", "the tutorial starts with its set-up"
    for doc in (TUTORIAL, REPO / "README.md", REPO / "docs" / "howto-users.md"):
        assert runnable_blocks(doc), f"{doc.name} has no runnable block"


def _linked_install(root: Path) -> dict[str, str]:
    """The README's install in ``root``: a link on PATH to a virtual environment's
    ``bin/mpswrap`` (a console script with that environment's interpreter), and a ``python3``
    without mpswrap, as the system's is. Only the script itself imports the tree under test
    (and passes it on to what mpswrap starts); the shell has no PYTHONPATH."""
    script = root / "venv" / "bin" / "mpswrap"
    script.parent.mkdir(parents=True)
    script.write_text(
        f"#!{sys.executable}\nimport os, sys\nsys.path.insert(0, {str(REPO)!r})\n"
        f"os.environ['PYTHONPATH'] = {str(REPO)!r}\n"
        "from mpswrap.cli.main import main\nsys.exit(main())\n"
    )
    links = root / "local" / "bin"
    links.mkdir(parents=True)
    (links / "mpswrap").symlink_to(script)
    # No site-packages (-S), no PYTHONPATH (-I): this python3 cannot import mpswrap.
    (links / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    for program in (script, links / "python3"):
        program.chmod(0o755)
    (root / "home").mkdir()
    (root / "clone").mkdir()
    env = {k: v for k, v in doc_env().items() if k not in ("PYTHONPATH", "XDG_RUNTIME_DIR")}
    return {
        **env,
        "PATH": f"{links}:/usr/bin:/bin",
        "HOME": str(root / "home"),
        "MPSWRAP_RUN_DIR": str(root / "run"),
        "MPSWRAP_USER_RUN_DIR": str(root / "user"),
    }


def test_the_tutorials_set_up_works_through_a_link_to_the_venvs_mpswrap() -> None:
    """The tutorial's first blocks (the simulator, then ``mpswrap config``) where ``mpswrap``
    is the README's link and ``python3`` has no mpswrap: ``mpswrap sim`` writes programs that
    run mpswrap's interpreter (``python3 -m mpswrap.sim`` fails there)."""
    tutorial = runnable_blocks(TUTORIAL)
    blocks = [b for b in tutorial if b.tag == "setup"]
    blocks.append(tutorial[len(blocks)])
    assert "mpswrap config" in blocks[-1].code, blocks[-1].where
    root = Path(tempfile.mkdtemp(prefix="mpsw-doc-", dir="/tmp"))
    try:
        env = _linked_install(root)
        done = run_blocks(blocks, env, root / "clone", root / "state.sh", timeout=120)
        found = problems(done, blocks)
        client = root / "home" / "mps-sim" / "mps-sim-client"
        ran = subprocess.run(
            ["sh", "-c", f'[ -x "{client}" ] && exec "{client}" --seconds 0'],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        old = subprocess.run(
            ["python3", "-m", "mpswrap.sim", "inventory", str(root / "x.json")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        sim = subprocess.run(["mpswrap", "sim"], env=env, capture_output=True, text=True)
    finally:
        left = finish_sim_node(SimNode(root))
    assert not found, "\n\n".join(found)
    assert ran.returncode == 0 and "mps-sim-client" in ran.stdout, ran.stdout + ran.stderr
    assert old.returncode == 1 and "No module named 'mpswrap'" in old.stderr, old.stderr
    assert sim.returncode == 2, sim.stderr
    assert sim.stderr.splitlines()[-1] == "hint: mpswrap sim --help", sim.stderr
    assert not left, left
