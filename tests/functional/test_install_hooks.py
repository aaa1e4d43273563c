"""`mpswrap install-hooks` refuses what a user other than root could change: root runs the
interpreter, the mpswrap package and the config file on every job, so whoever may write one
of them (or a directory above it) would run code as root."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpswrap import __version__
from mpswrap.config import DEFAULT_CONFIG_FILE
from tests.tree import PACKAGE
from tests.users import ensure_test_user, run_as
from tests.wheel import wheel_under_test

#: Environment Modules' shell setup (Debian: environment-modules).
MODULES_INIT = Path("/usr/share/modules/init/bash")

pytestmark = [
    pytest.mark.functional,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="installs hooks as root, owned by a test user"),
]


def _install(
    tmp: Path, python: str, config: Path | str, *more: str, dest: Path | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "mpswrap", "install-hooks", "--python", python]
    argv += ["--config", str(config), "--dest", str(dest or tmp / "hooks"), *more]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    return tmp_path


@pytest.fixture
def shared() -> Iterator[Path]:
    """A root-owned 0755 directory that every user can reach and none other may write to:
    not under /tmp (pytest's own directories are 0700, and /tmp is everyone's)."""
    path = Path(tempfile.mkdtemp(prefix="mpswrap-test-", dir="/run"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _warnings(res: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.startswith("install-hooks: warning: ")]


def test_missing_directories_of_dest_are_made_roots_and_only_below_a_safe_level(
    shared: Path,
) -> None:
    """The guide's --dest /usr/local/libexec/mpswrap where /usr/local/libexec does not exist;
    never a directory under a level another user may change."""
    config = shared / "mpswrap.conf"
    config.write_text("prolog_mode = opt-in\n")
    config.chmod(0o644)
    dest = shared / "usr" / "local" / "libexec" / "mpswrap"
    res = _install(shared, sys.executable, config, dest=dest)
    assert res.returncode == 0, res.stderr
    for level in (shared / "usr", shared / "usr" / "local", dest.parent, dest):
        st = level.stat()
        assert (st.st_uid, oct(stat.S_IMODE(st.st_mode))) == (0, "0o755"), level
        assert level == dest or f"install-hooks: created {level} (root's, mode 0755)" in res.stdout
    assert sorted(p.name for p in dest.iterdir()) == ["epilog", "prolog", "task_prolog"]
    assert not _warnings(res), res.stderr
    theirs = shared / "theirs"
    theirs.mkdir()
    shutil.chown(theirs, ensure_test_user())
    res = _install(shared, sys.executable, config, dest=theirs / "libexec" / "mpswrap")
    assert res.returncode != 0, res.stdout
    assert f"the shims' directory {theirs} can be changed by a user other than root" in res.stderr
    assert not (theirs / "libexec").exists()


def test_a_dest_under_tmp_is_installed_with_one_warning(tmp: Path) -> None:
    res = _install(tmp, sys.executable, tmp / "mpswrap.conf")
    assert res.returncode == 0, res.stderr
    found = [w for w in _warnings(res) if "which every user may write to" in w]
    assert found == [
        f"install-hooks: warning: {tmp / 'hooks'} is under /tmp, which every user may write to: a "
        "job's private /tmp (job_container/tmpfs) hides it and a cleaner may remove it; "
        "install outside it (e.g. /usr/local/libexec/mpswrap)"
    ], res.stderr


def test_an_interpreter_job_users_cannot_reach_is_named_by_the_level_at_fault(
    shared: Path,
) -> None:
    """pyenv's interpreters live under /root (0700): the warning says that is the cause."""
    private = shared / "private"
    private.mkdir(mode=0o700)
    if sys.prefix != sys.base_prefix:  # a venv: the interpreter finds its pyvenv.cfg there
        (private / "env").symlink_to(sys.prefix)
        python = private / "env" / Path(sys.executable).relative_to(sys.prefix)
    else:
        python = private / "python"
        python.symlink_to(sys.executable)
    res = _install(shared, str(python), shared / "mpswrap.conf")
    assert res.returncode == 0, res.stderr
    found = [w for w in _warnings(res) if "user 'nobody' cannot run" in w]
    assert len(found) == 1, res.stderr
    assert found[0].endswith(
        f"the TaskProlog runs as the job user and will fail; {private} is mode 700, owner "
        "root: use an interpreter and package outside it, or open it to others"
    ), found


@pytest.mark.skipif(not MODULES_INIT.exists(), reason=f"needs {MODULES_INIT} (environment-modules)")
@pytest.mark.parametrize("default_config", [False, True], ids=["own-config", "default-config"])
def test_module_load_puts_mpswrap_on_path_and_names_a_config_not_at_the_default(
    shared: Path, default_config: bool
) -> None:
    """``--modulefile DIR``: a job user's ``module load mpswrap`` (Environment Modules, Tcl)
    finds the hooks' mpswrap, alone (not the environment's python), and the admin file."""
    config = DEFAULT_CONFIG_FILE if default_config else str(shared / "etc" / "mpswrap.conf")
    dest, modules = shared / "libexec" / "mpswrap", shared / "modulefiles"
    res = _install(shared, sys.executable, config, "--modulefile", str(modules), dest=dest)
    assert res.returncode == 0, res.stderr
    module = modules / "mpswrap" / __version__
    assert oct(stat.S_IMODE(module.stat().st_mode)) == "0o644"
    assert f"install-hooks: wrote the module {module} " in res.stdout
    script = (
        f"source {MODULES_INIT} && module load mpswrap && command -v mpswrap python3 && "
        'echo "config=${MPSWRAP_CONFIG-unset}" && mpswrap version'
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": "/", "MODULEPATH": str(modules)}
    ran = run_as(ensure_test_user(), ["bash", "-c", script], env, cwd="/")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.splitlines() == [
        str(dest / "bin" / "mpswrap"),
        "/usr/bin/python3",
        f"config={'unset' if default_config else config}",
        f"mpswrap {__version__}",
    ], ran.stdout
    argv = [sys.executable, "-m", "mpswrap", "uninstall-hooks", "--dest", str(dest)]
    res = subprocess.run([*argv, "--modulefile", str(modules)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert not dest.exists() and not (modules / "mpswrap").exists(), res.stdout


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


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("install-hooks", "the hooks must be root-owned (slurmd runs them as root)"),
        ("uninstall-hooks", "the hooks are root's (install-hooks installed them as root)"),
    ],
)
def test_the_hooks_commands_as_a_user_are_one_line_exit_2(
    tmp: Path, command: str, why: str
) -> None:
    """The hooks are root's: a user's ``install-hooks`` or ``uninstall-hooks`` is a command
    line wrong for that user, one line and exit 2 as ``start --user`` run by a user, not in
    ``rm``'s words; nothing is written or removed."""
    dest = tmp / "hooks"
    dest.mkdir()
    (dest / "prolog").write_text("#!/bin/sh\n# mpswrap Slurm shim: test\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PACKAGE.parent)}
    argv = [sys.executable, "-m", "mpswrap", command, "--dest", str(dest)]
    res = run_as(ensure_test_user(), argv, env, cwd="/")
    assert (res.returncode, res.stderr) == (2, f"mpswrap: {command}: run as root: {why}\n")
    assert [p.name for p in dest.iterdir()] == ["prolog"]


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


def test_an_existing_shared_modulefiles_tree_keeps_its_mode(shared: Path) -> None:
    """A site's modulefiles tree is often group-writable (root:staff 2775): install-hooks warns
    and leaves its mode alone (users, not root, run modules); its own mpswrap/ is root's 0755.
    uninstall-hooks removes the module only from a directory of root's with mode 755."""
    dest, modules = shared / "libexec" / "mpswrap", shared / "modulefiles"
    modules.mkdir()
    modules.chmod(0o2775)
    res = _install(
        shared, sys.executable, DEFAULT_CONFIG_FILE, "--modulefile", str(modules), dest=dest
    )
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE(modules.stat().st_mode) == 0o2775
    assert "can be changed by a user other than root" in res.stderr, res.stderr
    assert stat.S_IMODE((modules / "mpswrap").stat().st_mode) == 0o755
    (modules / "mpswrap").chmod(0o775)  # someone made it group-writable since
    argv = [sys.executable, "-m", "mpswrap", "uninstall-hooks", "--dest", str(dest)]
    res = subprocess.run([*argv, "--modulefile", str(modules)], capture_output=True, text=True)
    assert res.returncode != 0 and "remove its mpswrap modules by hand" in res.stderr, res.stderr
    assert (modules / "mpswrap" / __version__).exists() and dest.exists()
    (modules / "mpswrap").chmod(0o755)
    res = subprocess.run([*argv, "--modulefile", str(modules)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert not dest.exists() and not (modules / "mpswrap").exists(), res.stdout


def _deps(venv: Path, root: Path, package: bool = True) -> Path:
    """psutil, filelock and pynvml (and ``package``: mpswrap, the tree under test) in
    ``root/deps``, a directory of root's that the venv's site-packages finds through a .pth
    file, as a site's venv would; that directory."""
    import filelock
    import psutil
    import pynvml

    deps = root / "deps"
    for module in (psutil, filelock):
        shutil.copytree(Path(str(module.__file__)).parent, deps / module.__name__)
    shutil.copy(str(pynvml.__file__), deps / "pynvml.py")
    if package:
        shutil.copytree(PACKAGE, deps / "mpswrap", ignore=shutil.ignore_patterns("__pycache__"))
    (next(venv.glob("lib/python3*/site-packages")) / "deps.pth").write_text(f"{deps}\n")
    subprocess.run(["chmod", "-R", "go-w,a+rX", str(root)], check=True)
    return deps


def _venv_with_deps(shared: Path, base: Path | None = None) -> tuple[Path, Path]:
    """A venv of ``base`` (this interpreter) that finds mpswrap and its dependencies in a
    directory of root's (``_deps``); (its python, that directory)."""
    venv = shared / "venv"
    argv = [str(base or sys.executable), "-m", "venv", "--without-pip", str(venv)]
    subprocess.run(argv, check=True, timeout=120)
    return venv / "bin" / "python", _deps(venv, shared)


@pytest.mark.parametrize("level", ["pth file", "pyvenv.cfg", "psutil"])
def test_the_interpreters_environment_another_user_can_change_is_refused(
    shared: Path, level: str
) -> None:
    """What the interpreter runs before and for mpswrap as root: its pyvenv.cfg, a .pth file
    of its site-packages (site runs its import lines), a package mpswrap imports. Changeable
    by a user at install: refused, naming it; after install: every prolog and epilog refuses
    to run, naming it (docs/security.md)."""
    python, deps = _venv_with_deps(shared)
    config = shared / "mpswrap.conf"
    config.write_text("prolog_mode = opt-in\n")
    config.chmod(0o644)
    res = _install(shared, str(python), config)
    assert res.returncode == 0, res.stderr
    site = next(python.parent.parent.glob("lib/python3*/site-packages"))
    changed = {
        "pth file": site / "deps.pth",
        "pyvenv.cfg": python.parent.parent / "pyvenv.cfg",
        "psutil": deps / "psutil" / "__init__.py",
    }[level]
    shutil.chown(changed, ensure_test_user())
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}
    shim = subprocess.run(
        [str(shared / "hooks" / "prolog")], env=env, capture_output=True, text=True, timeout=60
    )
    assert shim.returncode == 0, shim.stderr  # prolog_failure = continue: the job runs
    assert f"a user other than root can change {changed} " in shim.stderr, shim.stderr
    again = _install(shared, str(python), config, dest=shared / "again")
    assert again.returncode != 0, again.stdout
    assert str(changed) in again.stderr and "other than root" in again.stderr, again.stderr


def _venv_from_the_wheel(root: Path, wheel: Path) -> Path:
    """A fresh venv with the wheel under test installed by its own pip (its dependencies from
    ``_deps``: no index here); its python."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    subprocess.run([*pip, str(wheel)], check=True, timeout=120)
    _deps(venv, root, package=False)
    return venv / "bin" / "python"


#: What a user's login shell does with the module (the README: ``module use DIR`` where DIR is
#: not on their MODULEPATH), then with it unloaded again.
_USER_SESSION = """
set -e
module use "$1"
module load mpswrap
man -w mpswrap
man mpswrap | head -n 4
complete -p mpswrap
COMP_WORDS=(mpswrap sta); COMP_CWORD=1; _mpswrap; echo "offered: ${COMPREPLY[*]}"
man -w ls
module unload mpswrap
complete -p mpswrap 2>/dev/null || echo "no completion"
man -w mpswrap 2>/dev/null || echo "no page"
"""


@pytest.mark.skipif(not MODULES_INIT.exists(), reason=f"needs {MODULES_INIT} (environment-modules)")
@pytest.mark.timeout(600)
def test_the_module_gives_a_login_shell_the_man_page_and_completion(
    shared: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The wheel installs share/man/man1/mpswrap.1 and the completion script into a fresh venv;
    ``install-hooks --modulefile`` writes a module that a job user's login shell loads:
    ``man mpswrap`` finds and renders the page (and ``man ls`` still works), ``complete -p``
    shows the completion, which completes; unloaded, both are gone."""
    python = _venv_from_the_wheel(shared, wheel_under_test(tmp_path_factory.mktemp("wheel")))
    data = python.parent.parent
    assert (data / "share" / "man" / "man1" / "mpswrap.1").is_file()
    assert (data / "share" / "bash-completion" / "completions" / "mpswrap.bash").is_file()
    config, modules = shared / "mpswrap.conf", shared / "modulefiles"
    config.write_text("prolog_mode = opt-in\n")
    config.chmod(0o644)
    argv = [str(python.parent / "mpswrap"), "install-hooks", "--python", str(python)]
    argv += ["--config", str(config), "--dest", str(shared / "hooks")]
    res = subprocess.run(
        [*argv, "--modulefile", str(modules)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert not _warnings(res), res.stderr
    assert ", puts mpswrap(1) on MANPATH, loads the bash completion)" in res.stdout, res.stdout
    env = {"PATH": "/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8", "MANWIDTH": "80"}
    ran = run_as(ensure_test_user(), ["bash", "-l", "-c", _USER_SESSION, "bash", str(modules)], env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.splitlines() == [
        str(data / "share" / "man" / "man1" / "mpswrap.1"),  # man -w
        f"MPSWRAP(1){' ' * 23}User Commands{' ' * 22}MPSWRAP(1)",  # man mpswrap | head
        "",
        "NAME",
        "       mpswrap  - run many CUDA processes per GPU through NVIDIA MPS, on Slurm",
        "complete -o default -F _mpswrap mpswrap",
        "offered: start status",  # the loader read the script and completed
        "/usr/share/man/man1/ls.1.gz",  # the system's pages are still found
        "no completion",  # unloaded
        "no page",
    ], ran.stdout
    # No module: the venv's bin on PATH, or the README's links (here under a prefix of its own).
    local = shared / "local"
    for link in ("bin/mpswrap", "share/man/man1/mpswrap.1"):
        (local / link).parent.mkdir(parents=True, exist_ok=True)
        (local / link).symlink_to(data / link)
    found = [
        run_as(ensure_test_user(), ["man", "-w", "mpswrap"], {**env, "PATH": f"{bin_dir}:/bin"})
        for bin_dir in (data / "bin", local / "bin")
    ]
    # man-db names a linked page by where the link leads.
    assert [f.stdout for f in found] == [f"{data}/share/man/man1/mpswrap.1\n"] * 2, found


def _linked_base(shared: Path, mode: int, owner: str = "root") -> tuple[Path, Path]:
    """pyenv's layout as the admin guide meets it as root: a venv of root's whose
    ``bin/python`` links to an interpreter in ``shared/private`` (``mode``, ``owner``), as
    pyenv's live under /root (0700); (the venv's python, that directory)."""
    private = shared / "private"
    private.mkdir()
    base = getattr(sys, "_base_executable", sys.executable)  # this venv's interpreter's
    (private / "python3").symlink_to(os.path.realpath(base))
    python, _ = _venv_with_deps(shared, base=private / "python3")
    private.chmod(mode)
    shutil.chown(private, owner)
    return python, private


def test_a_venv_linked_into_a_directory_others_cannot_enter_is_named_by_that_directory(
    shared: Path,
) -> None:
    """The venv's own ``bin/python`` (a link, mode 777) is not the cause: the directory its
    link leads into is, which the job user cannot enter. Named under install-hooks' name;
    opened to others, the job user runs the interpreter and install-hooks says nothing."""
    python, private = _linked_base(shared, 0o700)
    user = ensure_test_user()
    assert run_as(user, [str(python), "-I", "-c", "import mpswrap"]).returncode != 0
    res = _install(shared, str(python), shared / "mpswrap.conf")
    assert res.returncode == 0, res.stderr
    assert [w for w in _warnings(res) if "user 'nobody' cannot run" in w] == [
        f"install-hooks: warning: user 'nobody' cannot run '{python} -I -c \"import mpswrap\"': "
        "the TaskProlog runs as the job user and will fail; "
        f"{private} is mode 700, owner root: use an interpreter and package outside it, or "
        "open it to others"
    ], res.stderr
    assert all(ln.startswith("install-hooks: ") for ln in res.stderr.splitlines()), res.stderr
    private.chmod(0o755)
    assert run_as(user, [str(python), "-I", "-c", "import mpswrap"]).returncode == 0
    res = _install(shared, str(python), shared / "mpswrap.conf", dest=shared / "again")
    assert res.returncode == 0, res.stderr
    assert not [w for w in _warnings(res) if "nobody" in w], res.stderr


def test_a_directory_a_link_of_the_interpreter_leads_into_is_checked_as_the_rest(
    shared: Path,
) -> None:
    """The hop between the venv's link and the interpreter: a directory another user owns
    there could swap the interpreter root runs. Refused at install, named; after install,
    every prolog refuses to run it (the shims check the same levels)."""
    user = ensure_test_user()
    python, private = _linked_base(shared, 0o755, owner=user)
    config = shared / "mpswrap.conf"
    config.write_text("prolog_mode = opt-in\n")
    config.chmod(0o644)
    res = _install(shared, str(python), config)
    assert res.returncode != 0, res.stdout
    uid = pwd.getpwnam(user).pw_uid
    assert (
        f"mpswrap: install-hooks: the interpreter {python} can be changed by a user other than "
        f"root: {private} (owned by uid {uid}); the hooks run it as root"
    ) in res.stderr.splitlines(), res.stderr
    shutil.chown(private, "root")
    res = _install(shared, str(python), config)
    assert res.returncode == 0, res.stderr
    shutil.chown(private, user)
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}
    shim = subprocess.run(
        [str(shared / "hooks" / "prolog")], env=env, capture_output=True, text=True, timeout=60
    )
    assert shim.returncode == 0, shim.stderr  # prolog_failure = continue: the job runs
    assert f"a user other than root can change {private} " in shim.stderr, shim.stderr


def test_run_as_the_script_it_says_so(tmp: Path) -> None:
    """``bash install.sh`` (CI's SPANK build, a clone) keeps its own name in what it says."""
    argv = ["bash", str(PACKAGE / "slurm" / "install.sh"), "--python", sys.executable]
    res = subprocess.run(
        [*argv, "--config", str(tmp / "none.conf"), "--dest", str(tmp / "hooks")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("install.sh: using mpswrap from "), res.stdout
    assert "install.sh: warning: " in res.stderr, res.stderr


@pytest.mark.parametrize("program", ["/bin/true", "/bin/echo"])
def test_a_python_that_is_no_python_is_refused_in_mpswraps_one_line(
    tmp: Path, program: str
) -> None:
    """A program that answers nothing (true) or something else (echo) for mpswrap's file is
    no interpreter the hooks can run: refused before anything is written."""
    config = tmp / "mpswrap.conf"
    config.write_text("")
    res = _install(tmp, program, config)
    assert res.returncode == 1, res.stdout
    line = res.stderr.strip()
    assert line.startswith(
        f"mpswrap: install-hooks: {program} is not a Python interpreter with mpswrap: asked "
        "for mpswrap's file, it printed '"
    ), res.stderr
    assert "\n" not in line
    assert not (tmp / "hooks").exists()
