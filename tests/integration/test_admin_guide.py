"""The admin guide (slurm/README.md), followed as written under a real Slurm.

Its ``<!-- runnable: admin -->`` blocks run in order, as root, in one shell: a wheel into a
fresh environment, the admin config, the MPS simulator and its settings ("Try it without a
GPU": this machine has none; its block runs after the config file's, where that section says
it goes), ``mpswrap install-hooks``, the slurm.conf lines and ``scontrol reconfigure``, the
guide's checks (a job of the non-root user that opts in with ``--constraint=mps``;
``module load mpswrap``, the man page, the completion and ``mpswrap status`` in such a job;
the simulated CUDA program's tasks reach their daemon). Then a job
step of the simulated CUDA program must be an MPS client of the daemon the prolog started, a
job's ``mpswrap status`` must find its daemon without the module (the task prolog names the
config file), and after the epilog nothing of the job may be left. The guide's Undo blocks
run last (also after a failure), then nothing the guide installed may be left.

What the test changes, and nothing else: the six settings of the guide's first block (the
wheel under test, paths of its own, the test user) and ``SIM`` of the simulator's block,
``MODULEPATH`` (its modules directory, as Debian's is on the default one), one line it
appends to the config file (the cluster's run_dir), and the same paths where the guide's
shown output names the defaults. The cluster's fake GPUs are the guide's: character devices
of major 195, minors 0 and 1, in gres.conf (up.sh makes them as the guide does). The paths
are those of a machine without ``/usr/local/libexec`` (the guide's ``--dest`` then has a
missing parent), under a directory of root's outside ``/tmp``, with the config file not at
its default path. The cluster is
this module's own: its slurm.conf names no hooks until the guide adds them, and its nodes
carry ``Features=mps`` as the guide tells admins to set for ``feature:mps``.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docblocks import Block, doc_env, problems, run_blocks, runnable_blocks
from tests.integration.harness import (
    SAFE_PATH,
    USER,
    Cluster,
    read_records,
    running_cluster,
    why_not_runnable,
)
from tests.tree import REPO
from tests.wheel import wheel_under_test

GUIDE = REPO / "slurm" / "README.md"
#: The guide's section for a node without a GPU, which this test's cluster is.
NO_GPU = "## Try it without a GPU"
#: The guide's settings (its first block) and what the test puts there instead.
SETTINGS = ("WHEEL", "VENV", "CONF", "HOOKS", "MODULES", "JOBUSER")
#: The run_dir of the guide's config file (its shown output names it).
GUIDE_RUN_DIR = "/run/mpswrap"

_skip = why_not_runnable()
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slurm_version,
    pytest.mark.skipif(_skip is not None, reason=_skip or ""),
]


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """This module's own cluster (it overrides conftest's): no mpswrap hooks in slurm.conf
    until the guide adds them; every node has ``Features=mps``."""
    failed = lambda: request.session.testsfailed > 0  # noqa: E731
    with running_cluster(failed, hooks=False, features="mps") as made:
        yield made


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel CI built (``MPS_TEST_WHEEL``), or one built from this tree."""
    return wheel_under_test(tmp_path_factory.mktemp("wheel"))


def _settings_block(block: Block, values: dict[str, str]) -> tuple[Block, dict[str, str]]:
    """The guide's first block with the test's values; and the guide's own values."""
    defaults = {}
    code = block.code
    for name, value in values.items():
        line = re.compile(rf"^export {name}=(\S+)(.*)$", re.MULTILINE)
        found = list(line.finditer(code))
        assert len(found) == 1, f"{block.where}: expected one 'export {name}=...' line"
        defaults[name] = found[0].group(1)
        start, end = found[0].span(1)  # the guide's value: put the test's in its place
        code = code[:start] + value + code[end:]
    assert set(re.findall(r"^export (\w+)=", code, re.MULTILINE)) == set(values), block.code
    return Block(block.path, block.line, code, block.tag, block.output), defaults


def _with_paths(blocks: list[Block], paths: dict[str, str]) -> list[Block]:
    """The blocks with the guide's default paths in their shown output replaced."""
    out = []
    for block in blocks:
        shown = block.output
        for default, value in paths.items():
            shown = shown.replace(default, value) if shown is not None else None
        out.append(Block(block.path, block.line, block.code, block.tag, shown))
    return out


def _run_dir_block(cluster: Cluster) -> Block:
    """The cluster's run_dir (whose leftovers the harness checks), after the guide's config
    file and its simulator lines: the last value of a key wins."""
    code = f"cat >>\"$CONF\" <<'EOF'\nrun_dir = {cluster.run_dir}\nEOF\n"
    return Block(Path(__file__), 0, code, "admin")


def _section(lines: list[str], heading: str) -> range:
    """The line numbers (1-based, as Block.line) of a ``## `` section."""
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return range(start, end + 1)


def _guide(cluster: Cluster, values: dict[str, str], sim: str) -> tuple[list[Block], list[Block]]:
    """(install and check, undo) blocks of the guide as this test runs them: in the guide's
    order, but the simulator's block of "Try it without a GPU" (this cluster has no GPU) right
    after the config file's, where that section says it goes, with ``SIM`` set to ``sim``."""
    blocks = runnable_blocks(GUIDE)
    assert blocks and all(b.tag == "admin" for b in blocks), [b.where for b in blocks]
    lines = GUIDE.read_text().splitlines()
    undo_line = lines.index("## Undo") + 1
    no_gpu = [b for b in blocks if b.line in _section(lines, NO_GPU) and '>>"$CONF"' in b.code]
    assert len(no_gpu) == 1, f"expected one block of {NO_GPU!r} that adds to the config file"
    settings, defaults = _settings_block(blocks[0], values)
    simulator, sim_default = _settings_block(no_gpu[0], {"SIM": sim})
    paths = {defaults[k]: values[k] for k in ("VENV", "MODULES")}
    paths[sim_default["SIM"]] = sim
    # The hooks' directory's parent, which install-hooks names when it makes it.
    hooks, default_hooks = Path(values["HOOKS"]), Path(defaults["HOOKS"])
    assert hooks.name == default_hooks.name, (hooks, default_hooks)
    paths[str(default_hooks.parent)] = str(hooks.parent)
    paths[GUIDE_RUN_DIR] = str(cluster.run_dir)
    rest = _with_paths([b for b in blocks[1:] if b is not no_gpu[0]], paths)
    config = [i for i, b in enumerate(rest) if 'cat >"$CONF"' in b.code]
    assert len(config) == 1, "expected one block that writes the config file"
    at = config[0] + 1
    added = [*_with_paths([simulator], paths), _run_dir_block(cluster)]
    install = [settings, *rest[:at], *added, *rest[at:]]
    undo = [b for b in install if b.line > undo_line]
    install = [b for b in install if b.line <= undo_line]
    assert undo, "the guide's Undo section has no runnable block"
    return install, [settings, *undo]


def _env(cluster: Cluster, modules: str) -> dict[str, str]:
    env = doc_env(
        {
            "PATH": SAFE_PATH,
            "SLURM_CONF": str(cluster.slurm_conf),
            "HOME": "/root",
            "MODULEPATH": modules,
        }
    )
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(name, None)
    return env


def _check_client_job(cluster: Cluster, workdir: Path) -> None:
    """A step of the simulated CUDA program, opted in as the guide says, is an MPS client of
    its job's daemon; after the epilog nothing of the job is left and no node drained."""
    rec = workdir / "clients.jsonl"
    opts = ["--gres=gpu:1", "--constraint=mps", "-n2"]
    job = cluster.srun(*opts, *cluster.client_argv(rec, seconds=1), cwd=workdir)
    assert job.proc is not None and job.proc.returncode == 0, job.output
    starts = read_records(rec)
    assert len(starts) == 2, f"{starts}\n{job.output}"
    assert all(s["mode"] == "mps" for s in starts), starts
    pipes = {s["pipe"] for s in starts}
    assert len(pipes) == 1, starts
    assert next(iter(pipes)).startswith(f"{cluster.run_dir}/"), starts
    assert f"/{job.id}/" in next(iter(pipes)), starts
    procs, dirs = cluster.wait_clean()
    assert not procs and not dirs, (procs, dirs)
    assert not cluster.drained_nodes(), cluster.drained_nodes()


def _check_status_without_the_module(cluster: Cluster, workdir: Path, venv: str) -> None:
    """A job user's ``mpswrap status`` in a job finds the prolog's daemon with no
    MPSWRAP_CONFIG of its own: the task prolog tells every task where the config file is."""
    argv = [f"{venv}/bin/mpswrap", "status"]
    job = cluster.srun("--gres=gpu:1", "--constraint=mps", *argv, cwd=workdir)
    assert job.proc is not None and job.proc.returncode == 0, job.output
    assert f"job {job.id} on node1: 1 GPU daemon(s)" in job.output, job.output
    assert " running (by prolog, user " in job.output, job.output


@pytest.fixture
def admin_root() -> Iterator[Path]:
    """Where the guide installs everything: root's, 0755, outside /tmp (the guide says the
    shims do not belong there), with ``usr/local`` but no ``usr/local/libexec``."""
    root = Path(tempfile.mkdtemp(prefix="mpswrap-admin-guide.", dir="/opt"))
    try:
        root.chmod(0o755)
        (root / "usr" / "local").mkdir(mode=0o755, parents=True)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)  # whatever the Undo blocks did not remove


def test_admin_guide_install_job_undo(
    cluster: Cluster, workdir: Path, wheel: Path, tmp_path: Path, admin_root: Path
) -> None:
    root = admin_root
    values = {
        "WHEEL": str(wheel),
        "VENV": str(root / "venv"),
        "CONF": str(root / "etc" / "mpswrap.conf"),
        "HOOKS": str(root / "usr" / "local" / "libexec" / "mpswrap"),
        "MODULES": str(root / "modulefiles"),
        "JOBUSER": USER,
    }
    assert tuple(values) == SETTINGS
    install, undo = _guide(cluster, values, str(root / "sim"))
    node_lines = re.findall(r"^NodeName=.*$", cluster.slurm_conf.read_text(), re.MULTILINE)
    assert node_lines and all(" Features=mps " in line for line in node_lines), node_lines
    env = _env(cluster, values["MODULES"])
    try:
        done = run_blocks(install, env, cwd=workdir, state=tmp_path / "install.sh", timeout=300)
        found = problems(done, install)
        assert not found, "\n".join(found)
        _check_client_job(cluster, workdir)
        _check_status_without_the_module(cluster, workdir, values["VENV"])
    finally:
        undone = run_blocks(undo, env, cwd=workdir, state=tmp_path / "undo.sh", timeout=120)
        installed = [Path(values[k]) for k in ("VENV", "HOOKS", "CONF")]
        installed.append(Path(values["MODULES"]) / "mpswrap")
        left = [p for p in installed if p.exists()]
    found = problems(undone, undo)
    assert not found, "\n".join(found)
    assert not left, f"the guide's Undo left {left}"
    config = cluster.slurm("scontrol", "show", "config").stdout
    assert str(root) not in config, "slurm.conf still names the hooks after Undo"
