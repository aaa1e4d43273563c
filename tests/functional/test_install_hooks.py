"""`mpswrap install-hooks` refuses what a user other than root could change: root runs the
interpreter, the mpswrap package and the config file on every job, so whoever may write one
of them (or a directory above it) would run code as root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tree import PACKAGE
from tests.users import ensure_test_user

pytestmark = [
    pytest.mark.functional,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="installs hooks as root, owned by a test user"),
]


def _install(tmp: Path, python: str, config: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "mpswrap",
        "install-hooks",
        "--python",
        python,
        "--config",
        str(config),
        "--dest",
        str(tmp / "hooks"),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    return tmp_path


def test_an_interpreter_in_a_users_directory_is_refused(tmp: Path) -> None:
    user = ensure_test_user()
    theirs = tmp / "theirs"
    theirs.mkdir()
    shutil.chown(theirs, user)
    (theirs / "python").symlink_to(sys.executable)
    res = _install(tmp, str(theirs / "python"), tmp / "mpswrap.conf")
    assert res.returncode != 0, res.stdout
    assert "can be changed by a user other than root" in res.stderr, res.stderr
    assert f"{theirs} (owned by uid" in res.stderr, res.stderr
    assert not (tmp / "hooks").exists()


def test_a_config_file_others_may_write_is_refused(tmp: Path) -> None:
    config = tmp / "mpswrap.conf"
    config.write_text("prolog_mode = opt-in\n")
    config.chmod(0o666)
    res = _install(tmp, sys.executable, config)
    assert res.returncode != 0, res.stdout
    assert f"the config file {config} can be changed" in res.stderr, res.stderr
    assert "(mode 666)" in res.stderr, res.stderr
    assert not (tmp / "hooks").exists()
    config.chmod(0o644)  # the same, safe: installed
    res = _install(tmp, sys.executable, config)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in (tmp / "hooks").iterdir()) == ["epilog", "prolog", "task_prolog"]


def test_a_control_program_others_may_change_is_named_at_install(tmp: Path) -> None:
    """The hooks would refuse to run it (docs/security.md): install-hooks says so now, and
    installs (the admin may be about to move it)."""
    user = ensure_test_user()
    theirs = tmp / "theirs"
    theirs.mkdir()
    shutil.chown(theirs, user)
    control = Path(shutil.copy(sys.executable, theirs / "nvidia-cuda-mps-control"))
    config = tmp / "mpswrap.conf"
    config.write_text(f"control_binary = {control}\n")
    config.chmod(0o644)
    res = _install(tmp, sys.executable, config)
    assert res.returncode == 0, res.stderr
    warning = (
        f"mpswrap: warning: root will not run the MPS control program {control}: "
        f"{theirs} (owned by uid"
    )
    assert warning in res.stderr, res.stderr


@pytest.mark.parametrize(
    "listing",
    [
        pytest.param("Epilog  = {dest}/epilog\nProlog  = {dest}/prolog\n", id="22.05"),
        pytest.param("Epilog[0]  = {dest}/epilog\nProlog[0]  = {dest}/prolog\n", id="24.11"),
    ],
)
def test_uninstall_refuses_while_slurm_names_a_shim(tmp: Path, listing: str) -> None:
    """Whatever way the release lists its hooks (24.11: ``Prolog[0]``), a shim slurm.conf
    still names is not removed: every job on the node would fail its prolog and drain it.
    Here only the prolog and epilog are mpswrap's (a site's own task prolog)."""
    dest = tmp / "hooks"
    bin_dir = tmp / "bin"
    for path in (dest, bin_dir):
        path.mkdir()
    for name in ("prolog", "task_prolog", "epilog"):
        (dest / name).write_text("#!/bin/sh\n# mpswrap Slurm shim: test\n")
    config = listing.format(dest=dest) + "TaskProlog              = /usr/local/site/task_prolog\n"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\ncat <<'EOF'\n{config}EOF\n")
    scontrol.chmod(0o755)
    argv = [sys.executable, "-m", "mpswrap", "uninstall-hooks", "--dest", str(dest)]
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode != 0, res.stdout
    assert "slurm.conf still points at" in res.stderr, res.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["epilog", "prolog", "task_prolog"]


def test_uninstall_refuses_while_plugstack_names_the_plugin(tmp: Path) -> None:
    """A plugstack.conf line naming the plugin (as ``required``, every sbatch would fail once
    it is gone) stops uninstall-hooks; a commented-out line does not."""
    dest, bin_dir = tmp / "hooks", tmp / "bin"
    for path in (dest, bin_dir):
        path.mkdir()
    plugin = dest / "mpswrap_spank.so"
    plugin.write_bytes(b"\x7fELF...mpswrap: bad --mps policy '%s'...")
    stack = tmp / "plugstack.conf"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho 'PlugStackConfig         = {stack}'\n")
    scontrol.chmod(0o755)
    argv = [sys.executable, "-m", "mpswrap", "uninstall-hooks", "--dest", str(dest)]
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    stack.write_text(f"required {plugin}\n")
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode != 0 and "still names" in res.stderr, res.stderr
    assert plugin.exists()
    stack.write_text(f"# required {plugin}\n")
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    assert not plugin.exists() and not dest.exists()


@pytest.mark.skipif(
    not Path("/usr/include/slurm/spank.h").exists() or shutil.which("cc") is None,
    reason="needs Slurm's headers and cc for the SPANK plugin",
)
def test_a_compiler_warning_fails_the_spank_build_and_is_shown(tmp: Path) -> None:
    """The plugin runs inside srun and slurmstepd: install.sh builds it with -Werror and shows
    what the compiler said. A copy of the package's installer, its source given a warning."""
    slurm = tmp / "slurm"
    shutil.copytree(PACKAGE / "slurm", slurm, ignore=shutil.ignore_patterns("__pycache__"))
    with (slurm / "mpswrap_spank.c").open("a") as source:
        source.write("int mpswrap_warned(void) { int unused; return 0; }\n")
    config, dest = str(tmp / "mpswrap.conf"), str(tmp / "hooks")
    install = [str(slurm / "install.sh"), "--spank", "--python", sys.executable]
    argv = ["bash", *install, "--config", config, "--dest", dest]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0, res.stdout
    assert "-Wall -Wextra -Werror" in res.stdout, res.stdout
    assert "unused variable" in res.stderr and "compiler output above" in res.stderr, res.stderr
    assert not (tmp / "hooks" / "mpswrap_spank.so").exists()
