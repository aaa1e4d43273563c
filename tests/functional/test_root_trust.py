"""Root trusts only root (docs/security.md, "Trust"): what the root hooks read, run, lock and
blame, tried as a hostile user would, with real second users that the tests create.

- The admin config file and the MPS control program: read or run only while root alone can
  change them and every directory above them; else nothing runs, one line names the level.
- Root's locks: only in run_dir's root-only ``.locks``; whatever the job's user plants where
  the old locks were (a link, a directory, a FIFO) never stops a teardown.
- Leftovers: a process counts against a job only if it is the job's user's; another user's
  process that names a job's path is named in a warning, never ended, never blamed.
- Hooks of one job overlap (two epilogs, an epilog racing the prolog) and each exits 0 when
  nothing of the job survives; a misconfigured run_dir never drains a node by itself.
- A rank's whole process tree ends with the rank, though its children inherit the shield.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.functional.test_faults import admin_config, admin_job, gone, manifests, slurm_hook
from tests.functional.test_hook_fuzz import FUZZ
from tests.functional.test_security import tree
from tests.procs import described
from tests.simenv import SimNode, finish_sim_node, make_sim_node
from tests.tree import REPO
from tests.users import basics, ensure_other_user, ensure_test_user, run_as, spawn_as

pytestmark = [
    pytest.mark.functional,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the hooks as root, real users"),
]
REFUSED = "can be changed by a user other than root"
# ``node``: tests/conftest.py's simulated node of two GPUs; each test writes its admin file.


def _user(name: str) -> pwd.struct_passwd:
    return pwd.getpwnam(name)


def _evil(node: SimNode, owner: str) -> tuple[Path, Path]:
    """A program in a directory of ``owner``'s that leaves a mark whoever runs it."""
    home = node.root / f"home-{owner}"
    home.mkdir(mode=0o755)
    os.chown(home, _user(owner).pw_uid, _user(owner).pw_gid)
    program, mark = home / "evil.sh", home / "ran"
    made = run_as(
        owner,
        [
            "sh",
            "-c",
            f"printf '#!/bin/sh\\nid -u >>{mark}\\nexit 1\\n' >{program} && chmod 755 {program}",
        ],
    )
    assert made.returncode == 0, made.stderr
    return program, mark


def _daemons(node: SimNode) -> list[int]:
    pids = [int(str(m["daemon_pid"])) for m in manifests(admin_job(node)).values()]
    assert pids and not any(gone(pid) for pid in pids)
    return pids


def _nothing_of_the_job(node: SimNode) -> None:
    assert not admin_job(node).exists(), sorted(map(str, admin_job(node).rglob("*")))
    assert not node.leftovers(), [described(p) for p in node.leftovers()]


# --- what root reads and runs ---------------------------------------------------------------
@pytest.mark.parametrize("how", ["mode 0666", "owned by the user", "in the user's directory"])
def test_root_never_reads_an_admin_file_another_user_can_change(node: SimNode, how: str) -> None:
    """The other user makes the admin file name their program as the control binary. Root's
    hooks read none of it: the prolog starts nothing and says why in one line naming the
    level, the epilog keeps its contract, and the program never runs."""
    other = ensure_other_user()
    program, mark = _evil(node, other)
    path = admin_config(node, epilog_failure="drain")
    if how == "in the user's directory":
        path = Path(shutil.copy(path, node.root / f"home-{other}" / "mpswrap.conf"))
    elif how == "owned by the user":
        os.chown(path, _user(other).pw_uid, _user(other).pw_gid)
    else:
        path.chmod(0o666)
    edit = f"cp {path} {path}.new && echo 'control_binary = {program}' >>{path}.new"
    put = f"cat {path}.new >{path} 2>/dev/null || mv -f {path}.new {path}"  # write, or replace
    assert run_as(other, ["sh", "-c", f"{edit} && {{ {put}; }}"]).returncode == 0
    start = slurm_hook(node, "prolog", MPSWRAP_CONFIG=str(path))
    assert start.returncode == 0, start.stderr  # the defaults: prolog_failure = continue
    (line,) = [ln for ln in start.stderr.splitlines() if REFUSED in ln]
    assert f"admin config file {REFUSED} ({path})" in line, start.stderr
    end = slurm_hook(node, "epilog", MPSWRAP_CONFIG=str(path))
    assert end.returncode == 0, end.stderr
    assert not mark.exists(), f"root ran the other user's program: {mark.read_text()}"
    _nothing_of_the_job(node)
    for user in (None, other):  # whoever asks is told
        res = _config(node, path, user)
        assert res.returncode == 0, res.stderr
        assert f"root ignores the admin config file {path}" in res.stderr, res.stderr


def _config(node: SimNode, path: Path, user: str | None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "mpswrap", "config", "--config", str(path)]
    if user is None:
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    return run_as(user, argv, basics(PYTHONPATH=str(REPO)))


def _control_copy(node: SimNode, how: str) -> Path:
    """The simulator's control program where the other user can change it: a copy of root's
    in their directory, or root's own directory's link into theirs."""
    other = ensure_other_user()
    home = node.root / f"home-{other}"
    home.mkdir(mode=0o755, exist_ok=True)
    os.chown(home, _user(other).pw_uid, _user(other).pw_gid)
    copy = Path(shutil.copy2(node.control, home / "nvidia-cuda-mps-control"))
    if how == "owned by the user":
        os.chown(copy, _user(other).pw_uid, _user(other).pw_gid)
    if how == "a link into the user's directory":
        link = node.root / "bin-link"
        link.symlink_to(copy)
        return link
    return copy


@pytest.mark.parametrize(
    "how", ["owned by the user", "in the user's directory", "a link into the user's directory"]
)
def test_root_never_runs_a_control_program_another_user_can_change(node: SimNode, how: str) -> None:
    """The prolog refuses it in one line naming the level and starts nothing. An epilog whose
    control program became changeable after the prolog ends the job's daemons by signal."""
    binary = _control_copy(node, how)
    admin_config(node, control_binary=str(binary))
    start = slurm_hook(node, "prolog")
    assert start.returncode == 0, start.stderr
    (line,) = [ln for ln in start.stderr.splitlines() if REFUSED in ln]
    assert f"MPS control program {REFUSED} ({binary})" in line, start.stderr
    assert not admin_job(node).exists() and not node.leftovers()
    admin_config(node)
    assert slurm_hook(node, "prolog").returncode == 0
    pids = _daemons(node)
    admin_config(node, control_binary=str(binary))
    end = slurm_hook(node, "epilog")
    assert end.returncode == 0, end.stderr
    assert "ending the daemon by signal" in end.stderr, end.stderr
    assert all(gone(pid) for pid in pids)
    _nothing_of_the_job(node)


# --- what root blames --------------------------------------------------------------------------
def test_another_users_process_naming_a_job_path_is_never_ended_or_blamed(node: SimNode) -> None:
    """Job ids are easy to guess: the other user starts processes naming the next job's pipe
    directories (in the environment, and on the command line) before it exists. The job's
    epilog ends what root's record and cgroup say is the job's, never looks at what other
    processes name, leaves the squatters running and exits 0."""
    other = ensure_other_user()
    job = node.layout("101", admin=True)
    g0, g1 = str(job.gpu("g0").pipe), str(job.gpu("g1").pipe)
    squatters = [
        spawn_as(other, ["sleep", "300"], CUDA_MPS_PIPE_DIRECTORY=g0),
        spawn_as(other, ["/usr/bin/python3", "-c", "import time; time.sleep(301)", g1]),
    ]
    try:
        admin_config(node, epilog_failure="drain")
        assert slurm_hook(node, "prolog").returncode == 0
        pids = _daemons(node)
        end = slurm_hook(node, "epilog")
        assert end.returncode == 0, end.stderr
        assert all(s.poll() is None for s in squatters), "the epilog ended another user's process"
        assert all(gone(pid) for pid in pids)
        assert not job.job_dir.exists()
    finally:
        for squatter in squatters:
            squatter.kill()
            squatter.communicate(timeout=30)


def test_a_link_to_another_jobs_control_socket_never_carries_roots_commands(
    node: SimNode,
) -> None:
    """The job's user replaces the control socket in their pipe directory by a link to another
    user's job's socket (the node directory is readable, job ids easy to guess). Root sends
    its commands as the job's user, so the kernel refuses the other user's 0700 directory:
    the other job's daemon and client are untouched, and the epilog ends its own daemon."""
    user, other = ensure_test_user(), ensure_other_user()
    admin_config(node, epilog_failure="drain")
    assert slurm_hook(node, "prolog", job="102", user=other, gpus="0").returncode == 0
    theirs = admin_job(node, "102") / "g0"
    client = spawn_as(
        other,
        [node.client, "--seconds", "120"],
        CUDA_MPS_PIPE_DIRECTORY=str(theirs / "pipe"),
        CUDA_MPS_LOG_DIRECTORY=str(theirs / "log"),
    )
    try:
        assert client.stdout is not None
        assert "mode=mps" in client.stdout.readline()
        assert slurm_hook(node, "prolog", gpus="0").returncode == 0
        pids = _daemons(node)
        control = admin_job(node) / "g0" / "pipe" / "control"
        link = f"rm -f {control} && ln -s {theirs / 'pipe' / 'control'} {control}"
        assert run_as(user, ["sh", "-c", link]).returncode == 0
        log_before = (theirs / "log" / "control.log").read_text()
        end = slurm_hook(node, "epilog", gpus="0")
        assert end.returncode == 0, end.stderr
        assert all(gone(pid) for pid in pids)
        assert client.poll() is None, "the other job's client was ended"
        assert (theirs / "log" / "control.log").read_text() == log_before, "root reached it"
    finally:
        client.kill()
        client.communicate(timeout=30)
    assert slurm_hook(node, "epilog", job="102", user=other, gpus="0").returncode == 0
    _nothing_of_the_job(node)


# --- root's locks ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", [".g0.lock", ".g1.lock", ".g0.ranks.lock"])
@pytest.mark.parametrize("kind", ["link", "directory", "fifo"])
def test_a_lock_file_the_job_user_plants_never_stops_the_epilog(
    node: SimNode, name: str, kind: str
) -> None:
    """Where root's lock once was (the job directory, the job user's), the job's user plants a
    link to a file of root's, a directory or a FIFO. Root's lock is elsewhere, out of their
    reach: the epilog ends everything and exits 0, and the link's target is untouched."""
    secret = node.root / "secret"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    user = ensure_test_user()
    admin_config(node, epilog_failure="drain")
    assert slurm_hook(node, "prolog").returncode == 0
    pids = _daemons(node)
    path = admin_job(node) / name
    plant = {
        "link": f"ln -s {secret} {path}",
        "directory": f"mkdir {path}",
        "fifo": f"mkfifo {path}",
    }[kind]
    assert run_as(user, ["sh", "-c", f"rm -f {path} && {plant}"]).returncode == 0
    locks = node.run_dir / ".locks"
    assert run_as(user, ["ls", str(locks)]).returncode != 0, "root's locks are open to the user"
    before = tree(secret)
    end = slurm_hook(node, "epilog", timeout=60)
    assert end.returncode == 0, end.stderr
    assert all(gone(pid) for pid in pids)
    assert tree(secret) == before
    _nothing_of_the_job(node)
    assert not list(locks.iterdir()), "root's lock files outlived the job"


# --- hooks of one job at once ------------------------------------------------------------------
def _at_once(node: SimNode, hooks: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Run the hooks of job 101 at the same moment (threads: each waits for its process)."""
    out: list[subprocess.CompletedProcess[str] | None] = [None] * len(hooks)
    gate = threading.Barrier(len(hooks))

    def one(i: int) -> None:
        gate.wait()
        out[i] = slurm_hook(node, hooks[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(hooks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert all(res is not None for res in out)
    return [res for res in out if res is not None]


@pytest.mark.parametrize("round_", range(3))
def test_two_epilogs_of_a_two_gpu_job_at_once_both_exit_0(node: SimNode, round_: int) -> None:
    admin_config(node, epilog_failure="drain")
    assert slurm_hook(node, "prolog").returncode == 0
    pids = _daemons(node)
    for res in _at_once(node, ["epilog", "epilog"]):
        assert res.returncode == 0, res.stderr
        assert "left behind" not in res.stderr, res.stderr
    assert all(gone(pid) for pid in pids)
    _nothing_of_the_job(node)


def test_an_epilog_racing_the_prolog_of_its_job_exits_0(node: SimNode) -> None:
    """Whichever takes root's lock first, each hook exits 0; what the prolog started after
    the epilog was done goes with the next epilog."""
    admin_config(node, epilog_failure="drain")
    for res in _at_once(node, ["prolog", "epilog"]):
        assert res.returncode == 0, res.stderr
    assert slurm_hook(node, "epilog").returncode == 0
    _nothing_of_the_job(node)


# --- run_dir as an admin may leave it ------------------------------------------------------------
@pytest.mark.parametrize("how", ["a regular file", "below a directory of the user's", "missing"])
def test_a_misconfigured_run_dir_is_a_prolog_warning_and_never_drains(
    node: SimNode, how: str
) -> None:
    other = _user(ensure_other_user())
    run_dir = node.root / "site" / "run"
    run_dir.parent.mkdir(mode=0o755)
    if how == "a regular file":
        run_dir.write_text("not a directory\n")
    elif how == "below a directory of the user's":
        os.chown(run_dir.parent, other.pw_uid, other.pw_gid)
    admin_config(node, run_dir=str(run_dir), epilog_failure="drain", prolog_failure="continue")
    start = slurm_hook(node, "prolog")
    assert start.returncode == 0, start.stderr
    if how != "missing":
        assert "continuing without MPS" in start.stderr, start.stderr
    end = slurm_hook(node, "epilog")
    assert end.returncode == 0, end.stderr
    assert not node.leftovers()


# --- a rank's tree -----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["run", "farm"])
def test_a_rank_that_backgrounds_a_child_takes_it_along(node: SimNode, mode: str) -> None:
    """The child inherits the rank's shield (TERM, INT and HUP ignored), so ``kill`` alone
    would not end it. It ends with its rank: the run exits 0 with a clean teardown, and the
    next run of the same job starts."""
    user = ensure_test_user()
    line = "sh -c 'sleep 303 & echo child $!'"
    if mode == "farm":
        tasks = node.root / "tasks.txt"
        tasks.write_text(f"{line}\n")
        tasks.chmod(0o644)
        args = ["farm", "--job", "orr", "--per-gpu", "1", str(tasks)]
    else:
        args = ["run", "-n", "1", "--job", "orr", "--", "sh", "-c", "sleep 303 & echo child $!"]
    res = node.mpswrap(*args, user=user, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "left behind" not in res.stderr, res.stderr
    assert not _sleeping(user, "303"), "the rank's child outlived it"
    again = node.mpswrap("run", "-n", "1", "--job", "orr", "--", "true", user=user)
    assert again.returncode == 0, again.stderr


def _sleeping(user: str, seconds: str) -> list[int]:
    uid = _user(user).pw_uid
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "uids"])
        if p.info["uids"] and p.info["uids"].real == uid and p.info["cmdline"] == ["sleep", seconds]
    ]


# --- fuzzing: hostile state around the hooks -----------------------------------------------------
#: Where the job's user plants a link, a directory or a FIFO: root's old lock files, the
#: ranks' lock, the daemon's control socket.
PLANTED = (".g0.lock", ".g1.lock", ".g0.ranks.lock", "g0/pipe/control")


@st.composite
def hostile(draw: st.DrawFn) -> dict[str, object]:
    return {
        "config": draw(st.sampled_from(["ok", "0666", "other's", "0664"])),
        "plant": draw(st.sampled_from(["none", "link", "directory", "fifo"])),
        "where": draw(st.sampled_from(PLANTED)),
        "squatter": draw(st.booleans()),
        "epilogs": draw(st.integers(min_value=1, max_value=2)),
    }


@FUZZ
@given(case=hostile())
def test_any_hostile_state_keeps_the_hooks_contract(case: dict[str, object]) -> None:
    """Config mode and owner, a planted lock or control socket, another user's process naming
    the job's pipe, overlapping epilogs: every hook exits 0 (nothing of the job survives),
    root never runs the other user's program, and never ends their process."""
    node = make_sim_node(gpus=2)
    squatters: list[subprocess.Popen[str]] = []
    try:
        _hostile_round(node, case, squatters)
    finally:
        for squatter in squatters:
            squatter.kill()
            squatter.communicate(timeout=30)
        left = finish_sim_node(node)
    assert not left, (case, left)


def _hostile_round(
    node: SimNode, case: dict[str, object], squatters: list[subprocess.Popen[str]]
) -> None:
    other = ensure_other_user()
    program, mark = _evil(node, other)
    path = admin_config(node, epilog_failure="drain")
    if case["config"] == "other's":
        os.chown(path, _user(other).pw_uid, _user(other).pw_gid)
    elif case["config"] != "ok":
        path.chmod(int(str(case["config"]), 8))
    if case["config"] != "ok":
        run_as(other, ["sh", "-c", f"echo 'control_binary = {program}' >>{path}"])
    if case["squatter"]:
        pipe = str(node.layout("101", admin=True).gpu("g0").pipe)
        squatters.append(spawn_as(other, ["sleep", "302"], CUDA_MPS_PIPE_DIRECTORY=pipe))
    start = slurm_hook(node, "prolog")
    assert start.returncode == 0, (case, start.stderr)
    if case["plant"] != "none" and admin_job(node).exists():
        target = admin_job(node) / str(case["where"])
        plant = {
            "link": f"ln -s /etc/passwd {target}",
            "directory": f"mkdir {target}",
            "fifo": f"mkfifo {target}",
        }[str(case["plant"])]
        run_as(ensure_test_user(), ["sh", "-c", f"rm -f {target} && {plant}"])
    for res in _at_once(node, ["epilog"] * int(str(case["epilogs"]))):
        assert res.returncode == 0, (case, res.stderr)
        assert "Traceback" not in res.stderr, (case, res.stderr)
    assert not mark.exists(), (case, "root ran the other user's program")
    assert all(s.poll() is None for s in squatters), (case, "another user's process ended")
    assert not admin_job(node).exists(), case
