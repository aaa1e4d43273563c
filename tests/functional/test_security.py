"""Security: another user on the node must not reach, stop or redirect a job's MPS state.

Threat model (docs/reliability.md): the attacker is another local user, or the job's own user
trying to reach beyond the job through the root hooks. Protected: a job's daemon, its clients
and GPU state, and every other process and file of the node. Root only (two real users).
"""

from __future__ import annotations

import ast
import json
import os
import pwd
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.functional.test_faults import admin_config, admin_job, gone, manifests, slurm_hook
from tests.simenv import SimNode, finish_sim_node, make_sim_node
from tests.tree import PACKAGE
from tests.users import basics, ensure_other_user, ensure_test_user, run_as, spawn_as

pytestmark = [
    pytest.mark.functional,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: two real users"),
]


@pytest.fixture
def node() -> Iterator[SimNode]:
    sim = make_sim_node(gpus=2)
    admin_config(sim)
    yield sim
    left = finish_sim_node(sim)
    assert not left, f"left behind: {left}"


#: (A, B): the job's user and another user of the node.
Users = tuple[pwd.struct_passwd, pwd.struct_passwd]


@pytest.fixture
def users() -> Users:
    """(A, B): the job's user and another user of the node."""
    return pwd.getpwnam(ensure_test_user()), pwd.getpwnam(ensure_other_user())


def prolog(
    node: SimNode, user: str, job: str = "101", gpus: str = "0,1"
) -> dict[str, dict[str, Any]]:
    res = slurm_hook(node, "prolog", job=job, user=user, gpus=gpus)
    assert res.returncode == 0, res.stderr
    found = manifests(admin_job(node, job))
    assert found, res.stderr
    return found


def pipe_env(node: SimNode, job: str, key: str = "g0") -> dict[str, str]:
    dirs = node.layout(job, admin=True).gpu(key)
    return {"CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe), "CUDA_MPS_LOG_DIRECTORY": str(dirs.log)}


def control_as(
    node: SimNode, user: str, job: str, command: str, key: str = "g0"
) -> subprocess.CompletedProcess[str]:
    return run_as(user, [node.control], basics(**pipe_env(node, job, key)), input=command + "\n")


def tree(path: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """Owner, group, mode and content of everything under path (without following links)."""
    out = {}
    for p in [path, *sorted(path.rglob("*"))]:
        st = os.lstat(p)
        data = p.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        out[str(p)] = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), data)
    return out


def decoy(tmp: Path) -> Path:
    """A directory and file that belong to root, as a planted symlink's target would."""
    target = tmp / "target"
    target.mkdir(mode=0o755)
    (target / "precious").write_text("root's data\n")
    (target / "g0").mkdir(mode=0o755)
    (target / "g0" / "keep").write_text("keep\n")
    return target


# --- ownership ------------------------------------------------------------------------------
def test_prolog_makes_job_dirs_owned_by_the_job_user_0700(node: SimNode, users: Users) -> None:
    a, _ = users
    prolog(node, a.pw_name)
    for path in (node.run_dir, node.run_dir / "n1"):
        st = os.lstat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755), path
    job = admin_job(node, "101")
    for path in (job, *(job / k / sub for k in ("g0", "g1") for sub in ("", "pipe", "log"))):
        st = os.lstat(path)
        assert stat.S_ISDIR(st.st_mode), path
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (a.pw_uid, a.pw_gid, 0o700), path
    for key in ("g0", "g1"):
        st = os.lstat(job / key / "manifest.json")
        assert st.st_uid == a.pw_uid and not stat.S_IMODE(st.st_mode) & 0o022
    assert slurm_hook(node, "epilog", user=a.pw_name).returncode == 0


def test_daemons_and_servers_run_as_the_job_user_never_root(
    node: SimNode, users: Users, procs: list[subprocess.Popen[str]]
) -> None:
    a, _ = users
    found = prolog(node, a.pw_name)
    for m in found.values():
        uids = psutil.Process(int(m["daemon_pid"])).uids()
        assert tuple(uids) == (a.pw_uid,) * 3, uids
    rank = spawn_as(a.pw_name, [node.client, "--seconds", "60"], **pipe_env(node, "101"))
    procs.append(rank)
    assert "mode=mps" in (rank.stdout.readline() if rank.stdout else "")
    servers = [
        c for c in psutil.Process(int(found["g0"]["daemon_pid"])).children() if c.is_running()
    ]
    assert servers, "the client's server should run"
    for server in servers:
        assert tuple(server.uids()) == (a.pw_uid,) * 3
    end = slurm_hook(node, "epilog", user=a.pw_name)
    assert end.returncode == 0, end.stderr
    rank.communicate(timeout=30)


def test_daemons_are_never_multi_user(node: SimNode, users: Users) -> None:
    """Multi-user MPS (-multiuser-server, -M) lets one user's fault kill another's clients:
    mpswrap never starts it; each daemon is started as exactly ``<control> -d``."""
    a, _ = users
    found = prolog(node, a.pw_name)
    for m in found.values():
        argv = psutil.Process(int(m["daemon_pid"])).cmdline()
        assert argv[-1] == "-d", argv
        assert not {"-M", "-multiuser-server"} & set(argv), argv
    end = slurm_hook(node, "epilog", user=a.pw_name)
    assert end.returncode == 0, end.stderr


# --- another user ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "command", ["get_server_list", "quit", "get_default_active_thread_percentage"]
)
def test_another_user_cannot_query_or_quit_the_daemon(
    node: SimNode, users: Users, command: str
) -> None:
    a, b = users
    found = prolog(node, a.pw_name, gpus="0")
    res = control_as(node, b.pw_name, "101", command)
    assert (res.returncode, res.stdout, res.stderr.strip()) == (
        1,
        "",
        "Cannot find MPS control daemon process",
    )
    assert not gone(int(found["g0"]["daemon_pid"]))
    mine = control_as(node, a.pw_name, "101", "get_server_list")
    assert mine.returncode == 0, mine.stderr  # still answering its own user
    assert slurm_hook(node, "epilog", user=a.pw_name, gpus="0").returncode == 0


def test_another_users_client_runs_without_mps_and_is_not_listed(
    node: SimNode, users: Users
) -> None:
    a, b = users
    prolog(node, a.pw_name, gpus="0")
    res = run_as(b.pw_name, [node.client, "--seconds", "0.5"], basics(**pipe_env(node, "101")))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "mode=non-mps" in res.stdout, res.stdout
    intruder = int(res.stdout.split()[1])
    listed = control_as(node, a.pw_name, "101", "get_server_list")
    assert listed.returncode == 0 and listed.stdout.strip() == ""  # no server: nobody attached
    log = (admin_job(node, "101") / "g0" / "log" / "control.log").read_text()
    assert f"NEW CLIENT {intruder}" not in log
    assert slurm_hook(node, "epilog", user=a.pw_name, gpus="0").returncode == 0


def test_another_user_cannot_stop_or_read_the_job_through_mpswrap(
    node: SimNode, users: Users
) -> None:
    a, b = users
    found = prolog(node, a.pw_name, gpus="0")
    env = {k: v for k, v in node.env().items() if k.startswith("MPSWRAP_")}
    job = ["--job", "101", "--node", "n1", "--run-dir", str(node.run_dir)]
    for command in ("stop", "status"):
        res = run_as(b.pw_name, [sys.executable, "-m", "mpswrap", command, *job], basics(**env))
        assert res.returncode == 1, (command, res.stdout, res.stderr)
        assert "Traceback" not in res.stderr, res.stderr
        lines = [ln for ln in res.stderr.splitlines() if not ln.startswith("hint: ")]
        assert len(lines) == 1 and lines[0].startswith("mpswrap: "), res.stderr
        assert str(admin_job(node, "101")) in lines[0] and "Permission denied" in lines[0]
    assert not gone(int(found["g0"]["daemon_pid"]))
    assert slurm_hook(node, "epilog", user=a.pw_name, gpus="0").returncode == 0


# --- the job's own user against the root epilog -----------------------------------------------
def test_a_forged_manifest_cannot_make_the_epilog_kill_another_process(
    node: SimNode, users: Users, procs: list[subprocess.Popen[str]]
) -> None:
    a, _ = users
    prolog(node, a.pw_name, gpus="0")
    victim = subprocess.Popen(["sleep", "120"], text=True)  # a root process of the node
    procs.append(victim)
    path = admin_job(node, "101") / "g0" / "manifest.json"
    forged = json.loads(path.read_text())
    forged["daemon_pid"] = victim.pid
    forged["daemon_start_time"] = psutil.Process(victim.pid).create_time()  # readable by all
    forged["servers"] = [{"pid": victim.pid, "start_time": forged["daemon_start_time"]}]
    # The job user owns g0/, so the job user can replace the manifest.
    run_as(
        a.pw_name,
        ["sh", "-c", f"cat > {path}.new && mv {path}.new {path}"],
        input=json.dumps(forged),
    )
    assert json.loads(path.read_text())["daemon_pid"] == victim.pid
    slurm_hook(node, "epilog", user=a.pw_name, gpus="0")
    assert victim.poll() is None, (
        f"the root epilog signalled pid {victim.pid} ({victim.returncode})"
    )
    finish = slurm_hook(node, "epilog", user=a.pw_name, gpus="0")
    assert finish.returncode == 0, finish.stderr
    assert not admin_job(node, "101").exists()


def test_a_symlinked_user_mode_job_dir_cannot_make_the_epilog_touch_another_job(
    node: SimNode, users: Users
) -> None:
    a, b = users
    theirs = prolog(node, b.pw_name, job="999", gpus="0")  # another user's job on the node
    before = tree(admin_job(node, "999"))
    # A plants its user-mode job directory for job 101 as a link to B's job directory.
    mine = node.user_run_dir / "n1"
    run_as(a.pw_name, ["mkdir", "-p", "-m", "700", str(mine)])
    run_as(a.pw_name, ["ln", "-s", str(admin_job(node, "999")), str(mine / "101")])
    slurm_hook(node, "epilog", user=a.pw_name, job="101", gpus="0")
    assert not gone(int(theirs["g0"]["daemon_pid"])), "another job's daemon was stopped"
    assert tree(admin_job(node, "999")) == before
    assert slurm_hook(node, "epilog", user=b.pw_name, job="999", gpus="0").returncode == 0


def test_a_symlinked_gpu_dir_cannot_make_the_epilog_touch_another_job(
    node: SimNode, users: Users
) -> None:
    a, b = users
    theirs = prolog(node, b.pw_name, job="999", gpus="0")
    prolog(node, a.pw_name, job="101", gpus="1")
    before = tree(admin_job(node, "999"))
    # A owns its job directory and adds g0 -> B's g0.
    run_as(
        a.pw_name,
        ["ln", "-s", str(admin_job(node, "999") / "g0"), str(admin_job(node, "101") / "g0")],
    )
    slurm_hook(node, "epilog", user=a.pw_name, job="101", gpus="1")
    assert not gone(int(theirs["g0"]["daemon_pid"])), "another job's daemon was stopped"
    assert tree(admin_job(node, "999")) == before
    assert slurm_hook(node, "epilog", user=b.pw_name, job="999", gpus="0").returncode == 0
    shutil_rm(admin_job(node, "101"))


def test_a_symlinked_pipe_dir_cannot_make_the_epilog_command_another_users_daemon(
    node: SimNode, users: Users, procs: list[subprocess.Popen[str]]
) -> None:
    a, b = users
    theirs = prolog(node, b.pw_name, job="999", gpus="0")
    prolog(node, a.pw_name, job="101", gpus="1")
    their_rank = spawn_as(b.pw_name, [node.client, "--seconds", "120"], **pipe_env(node, "999"))
    procs.append(their_rank)
    assert "mode=mps" in (their_rank.stdout.readline() if their_rank.stdout else "")
    g1 = admin_job(node, "101") / "g1"
    # A stops its own daemon, points its pipe dir at B's, and names a live process of its
    # own (whose environment even names A's pipe path) as the daemon in its manifest.
    assert control_as(node, a.pw_name, "101", "quit", key="g1").returncode == 0
    run_as(a.pw_name, ["rm", "-rf", str(g1 / "pipe")])
    run_as(a.pw_name, ["ln", "-s", str(admin_job(node, "999") / "g0" / "pipe"), str(g1 / "pipe")])
    fake = spawn_as(a.pw_name, ["sleep", "120"], CUDA_MPS_PIPE_DIRECTORY=str(g1 / "pipe"))
    procs.append(fake)
    forged = json.loads((g1 / "manifest.json").read_text())
    forged["daemon_pid"] = fake.pid
    forged["daemon_start_time"] = psutil.Process(fake.pid).create_time()
    run_as(
        a.pw_name,
        ["sh", "-c", f"cat > {g1}/m && mv {g1}/m {g1}/manifest.json"],
        input=json.dumps(forged),
    )
    slurm_hook(node, "epilog", user=a.pw_name, job="101", gpus="1")
    assert not gone(int(theirs["g0"]["daemon_pid"])), "another user's daemon got quit"
    assert their_rank.poll() is None, "another user's client was terminated"
    assert slurm_hook(node, "epilog", user=b.pw_name, job="999", gpus="0").returncode == 0
    shutil_rm(admin_job(node, "101"))


def test_a_lock_file_symlink_in_the_job_dir_is_never_followed(
    node: SimNode, users: Users, tmp_path: Path
) -> None:
    a, _ = users
    prolog(node, a.pw_name, gpus="0")
    target = decoy(tmp_path)
    before = tree(target)
    lock = admin_job(node, "101") / ".g0.lock"
    run_as(a.pw_name, ["sh", "-c", f"rm -f {lock} && ln -s {target / 'precious'} {lock}"])
    assert lock.is_symlink()
    slurm_hook(node, "epilog", user=a.pw_name, gpus="0")
    assert tree(target) == before, "root wrote through the job user's symlink"
    # Whatever the first epilog did, the job can still be cleaned up.
    lock.unlink(missing_ok=True)
    assert slurm_hook(node, "epilog", user=a.pw_name, gpus="0").returncode == 0


def test_log_archive_never_copies_a_file_the_job_user_links_to(node: SimNode, users: Users) -> None:
    a, _ = users
    archive = node.root / "archive"
    admin_config(node, log_archive=str(archive))
    secret = node.root / "secret"  # stands for /etc/shadow: root's, mode 0600
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    prolog(node, a.pw_name, gpus="0")
    log = admin_job(node, "101") / "g0" / "log"
    run_as(a.pw_name, ["sh", "-c", f"rm -f {log}/server.log && ln -s {secret} {log}/server.log"])
    slurm_hook(node, "epilog", user=a.pw_name, gpus="0")
    copies = sorted(archive.glob("*")) if archive.exists() else []
    leaked = [p for p in copies if "root's secret" in p.read_text(errors="replace")]
    assert not leaked, f"root copied the job user's symlink target into {leaked}"
    assert any(p.name.endswith("control.log") for p in copies), copies  # the real log is kept
    assert slurm_hook(node, "epilog", user=a.pw_name, gpus="0").returncode == 0


# --- no symlink following when creating ---------------------------------------------------------
def test_a_symlink_at_the_user_run_dir_is_refused_and_its_target_untouched(
    node: SimNode, users: Users
) -> None:
    a, b = users
    # B plants A's run directory as a link to a directory B owns and A may write to.
    target = node.root / "planted"
    target.mkdir(mode=0o777)
    os.chown(target, b.pw_uid, b.pw_gid)
    target.chmod(0o777)
    node.user_run_dir.symlink_to(target)
    before = tree(target)
    res = node.mpswrap("start", "--job", "j1", "--node", "n1", user=a.pw_name)
    assert res.returncode == 2  # a bad value of the setting that names it
    assert res.stderr.splitlines()[0] == (
        f"mpswrap: refusing a path that is not a plain directory ({node.user_run_dir})"
    )
    assert tree(target) == before
    assert node.user_run_dir.is_symlink()


def test_a_symlink_at_the_job_dir_is_refused_by_the_prolog_and_its_target_untouched(
    node: SimNode, users: Users, tmp_path: Path
) -> None:
    a, _ = users
    target = decoy(tmp_path)
    before = tree(target)
    (node.run_dir / "n1").mkdir(parents=True)
    (admin_job(node, "101")).symlink_to(target)
    res = slurm_hook(node, "prolog", user=a.pw_name, MPSWRAP_PROLOG_FAILURE="continue")
    assert res.returncode == 0  # prolog_failure = continue: the job runs without MPS
    assert (
        f"refusing a path that is not a plain directory ({admin_job(node, '101')})" in res.stderr
    ), res.stderr
    assert tree(target) == before, "the prolog chowned or wrote into the symlink's target"
    assert not node.leftovers()
    admin_job(node, "101").unlink()


def test_a_run_dir_owned_by_another_user_is_refused(node: SimNode, users: Users) -> None:
    a, b = users
    node.user_run_dir.mkdir(mode=0o777)
    os.chown(node.user_run_dir, b.pw_uid, b.pw_gid)
    node.user_run_dir.chmod(0o777)
    res = node.mpswrap("start", "--job", "j1", "--node", "n1", user=a.pw_name)
    assert res.returncode == 2  # a bad value of the setting that names it
    assert res.stderr.splitlines()[0] == (
        f"mpswrap: directory has the wrong owner ({node.user_run_dir}): owned by uid "
        f"{b.pw_uid}, expected {a.pw_uid}"
    )
    assert list(node.user_run_dir.iterdir()) == []
    assert not node.leftovers()


# --- no shell ---------------------------------------------------------------------------------
def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_shell_true_anywhere_in_the_package() -> None:
    res = subprocess.run(
        ["grep", "-rn", "shell=True", str(PACKAGE)], capture_output=True, text=True
    )
    assert res.returncode == 1 and res.stdout == "", res.stdout
    assert len(_sources()) > 20


SHELLS = {
    "sh",
    "bash",
    "dash",
    "zsh",
    "ksh",
    "/bin/sh",
    "/bin/bash",
    "/usr/bin/sh",
    "/usr/bin/bash",
}
SHELL_CALLS = {
    "system",
    "popen",
    "spawnl",
    "spawnlp",
    "spawnv",
    "spawnvp",
    "getoutput",
    "getstatusoutput",
}


def _shell_uses(tree_: ast.AST) -> list[str]:
    found = []
    for node_ in ast.walk(tree_):
        if isinstance(node_, ast.Call):
            name = (
                node_.func.attr
                if isinstance(node_.func, ast.Attribute)
                else getattr(node_.func, "id", "")
            )
            if name in SHELL_CALLS:
                found.append(f"line {node_.lineno}: {name}()")
            for kw in node_.keywords:
                if kw.arg in ("shell", "executable"):
                    found.append(f"line {node_.lineno}: {kw.arg}=")
        if isinstance(node_, (ast.List, ast.Tuple)) and node_.elts:
            first = node_.elts[0]
            words = [e.value for e in node_.elts if isinstance(e, ast.Constant)]
            if isinstance(first, ast.Constant) and first.value in SHELLS and "-c" in words:
                found.append(f"line {node_.lineno}: [{first.value!r}, ..., '-c', ...]")
    return found


#: The one shell mpswrap runs on purpose: a farm's task line is the user's
#: own shell code (`cd run3 && python a.py > out`), run as that user by ``mpswrap farm`` under
#: their own uid, never by root nor by a hook. Nothing of mpswrap's is put into that line.
DELIBERATE_SHELLS = {"mpswrap/taskfarm/tasks.py": 1}


def test_the_package_never_invokes_a_shell() -> None:
    # The simulator's wrapper scripts are text written to files (#!/bin/sh ...), executed by
    # the kernel when a test or mpswrap runs the control program by path: not a shell call.
    problems = {}
    for path in _sources():
        uses = _shell_uses(ast.parse(path.read_text(), str(path)))
        name = str(path.relative_to(PACKAGE.parent))
        if len(uses) != DELIBERATE_SHELLS.get(name, 0):
            problems[name] = uses
    assert problems == {}
    from mpswrap.taskfarm.tasks import parse_tasks

    line = "python a.py > out.txt"
    assert parse_tasks([line])[0].argv == ["/bin/sh", "-c", line]  # the line as given, alone


def test_the_shell_detector_finds_shell_calls() -> None:
    sample = (
        "import os, subprocess\nos.system('x')\nsubprocess.run(['sh', '-c', 'x'])\n"
        "subprocess.run('x', shell=True)\n"
    )
    assert len(_shell_uses(ast.parse(sample))) == 3


def shutil_rm(path: Path) -> None:
    subprocess.run(["rm", "-rf", str(path)], check=True)


# --- the job listing and directory repair (root never trusts or changes a user's tree) -------
def _user_tree(base: Path, owner: pwd.struct_passwd, job: str) -> Path:
    """``base/mpswrap-<uid>/n1/<job>`` made by ``owner`` itself."""
    root = base / f"mpswrap-{owner.pw_uid}"
    res = run_as(owner.pw_name, ["mkdir", "-p", "-m", "700", str(root / "n1" / job)])
    assert res.returncode == 0, res.stderr
    return root


def test_roots_listing_takes_only_user_trees_their_owner_made(
    node: SimNode, users: Users, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mpswrap status`` as root lists every user's jobs: a tree counts only if every level
    is a real directory of the uid its path names; B's tree posing as A's, or a symlink into
    root's run dir, is not listed."""
    from mpswrap.config import load_settings
    from mpswrap.job import state

    a, b = users
    base = node.root / "roots"
    base.mkdir()
    base.chmod(0o1777)  # like /tmp
    _user_tree(base, a, "ja")
    posing = base / f"mpswrap-{b.pw_uid}"  # B's own tree: fine, listed as B's
    _user_tree(base, b, "jb")
    fake = base / "mpswrap-0"  # B makes a tree that claims to be root's
    run_as(b.pw_name, ["mkdir", "-p", str(fake / "n1" / "jroot")])
    os.symlink(node.run_dir, posing / "n1" / "jlink")  # a link in B's tree
    pattern = rf"^{base}/mpswrap-([0-9]+)$"
    monkeypatch.setattr(state, "USER_ROOT_GLOBS", ((re.compile(pattern), f"{base}/mpswrap-*"),))
    settings = load_settings({"run_dir": str(node.run_dir)}, env={})
    found = {lay.job_id for lay in state.jobs_on_node(settings, "n1", None)}
    assert found == {"ja", "jb"}
    mine = {lay.job_id for lay in state.jobs_on_node(settings, "n1", b.pw_uid)}
    assert "ja" not in mine and "jroot" not in mine and "jlink" not in mine


def test_one_users_names_in_tmp_never_hide_anothers_jobs_from_roots_listing(
    node: SimNode, users: Users, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root's listing looks at ``USER_ROOTS_LIMIT`` user-mode roots at most: B makes more
    names than that, each posing as another uid's root (any user may create a name in /tmp);
    A's real tree, sorted after them, is still listed."""
    from mpswrap.config import load_settings
    from mpswrap.job import state

    a, b = users
    base = node.root / "roots"
    base.mkdir()
    base.chmod(0o1777)  # like /tmp
    monkeypatch.setattr(state, "USER_ROOTS_LIMIT", 8)
    posers = [str(base / f"mpswrap-0{n}") for n in range(1, 21)]  # sorted before A's
    assert run_as(b.pw_name, ["mkdir", *posers]).returncode == 0
    _user_tree(base, a, "ja")
    pattern = rf"^{base}/mpswrap-([0-9]+)$"
    monkeypatch.setattr(state, "USER_ROOT_GLOBS", ((re.compile(pattern), f"{base}/mpswrap-*"),))
    settings = load_settings({"run_dir": str(node.run_dir)}, env={})
    assert {lay.job_id for lay in state.jobs_on_node(settings, "n1", None)} == {"ja"}


def test_owner_bits_are_given_back_by_the_owner_never_by_root(node: SimNode, users: Users) -> None:
    """A start repairs a ``chmod 500`` of the user's own directory; root (the prolog) leaves
    a job user's directory as it is, so a swapped-in symlink can never redirect a chmod."""
    a, _ = users
    target = node.root / "jobdir"
    assert run_as(a.pw_name, ["mkdir", "-m", "500", str(target)]).returncode == 0
    code = (
        "import sys; from pathlib import Path; from mpswrap.paths import ensure_private_dir;"
        f"ensure_private_dir(Path({str(target)!r}), {a.pw_uid}, {a.pw_gid})"
    )
    as_root = subprocess.run(
        [sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True
    )
    assert as_root.returncode == 0, as_root.stderr
    assert stat.S_IMODE(os.lstat(target).st_mode) == 0o500, "root changed a user's mode"
    res = run_as(a.pw_name, [sys.executable, "-c", code], basics(PYTHONPATH=str(PACKAGE.parent)))
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE(os.lstat(target).st_mode) == 0o700
