"""Root keeps its own record of each job (docs/security.md, "Root's record of a job"), tried
as a hostile job user would, with real second users that the tests create.

The job's user owns the job's directories: every file there (manifest, pid file, logs) and
the control socket may say anything. Root takes who the daemon is from its own record and the
cgroup it started the daemon in; every job file is typed input that, when bad, is ignored;
the whole teardown draws from one deadline, however much the job user multiplies; and what
is the job's is never read from another process's environment.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from mpswrap._cgroup import member_of
from mpswrap.mps.rootrecord import pin_control
from mpswrap.report.status import DEADLINE as STATUS_DEADLINE
from tests.functional.test_faults import (
    admin_config,
    admin_job,
    gone,
    manifests,
    slurm_hook,
    take_over_socket,
)
from tests.procs import described
from tests.simenv import SimNode, _cgroups_of, finish_sim_node, make_sim_node
from tests.tree import REPO
from tests.users import (
    basics,
    ensure_other_user,
    ensure_test_user,
    ensure_user,
    run_as,
    spawn_as,
)

pytestmark = [
    pytest.mark.functional,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the hooks as root, real users"),
]
#: The teardown's deadline in the tests that multiply work, and what starting Python, the
#: hooks' imports and a loaded 2-core machine may add to it.
DEADLINE = 8.0
SLACK = 12.0


@pytest.fixture
def node() -> Iterator[SimNode]:
    sim = make_sim_node(gpus=2)
    admin_config(sim)
    yield sim
    left = finish_sim_node(sim)
    assert not left, f"left behind: {left}"


def _user() -> str:
    return ensure_test_user()


def _prolog(node: SimNode, job: str = "101", gpus: str = "0,1", **env: str) -> list[int]:
    """The prolog of ``job`` for the test user; the daemons' PIDs as started."""
    res = slurm_hook(node, "prolog", job=job, gpus=gpus, timeout=120, **env)
    assert res.returncode == 0, res.stderr
    found = manifests(admin_job(node, job))
    assert found, res.stderr
    return [int(m["daemon_pid"]) for m in found.values()]


def _as_user(script: str) -> subprocess.CompletedProcess[str]:
    res = run_as(_user(), ["sh", "-c", script])
    assert res.returncode == 0, res.stderr
    return res


def _epilog_within(node: SimNode, job: str = "101", **env: str) -> tuple[float, str]:
    """The epilog of ``job``, which must exit 0; (its seconds, its stderr)."""
    took = time.monotonic()
    res = slurm_hook(node, "epilog", job=job, timeout=120, **env)
    took = time.monotonic() - took
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    return took, res.stderr


def _all_gone(node: SimNode, pids: list[int], job: str = "101") -> None:
    assert all(gone(pid) for pid in pids), [
        described(psutil.Process(p)) for p in pids if not gone(p)
    ]
    assert not admin_job(node, job).exists(), sorted(map(str, admin_job(node, job).rglob("*")))
    assert not list((node.run_dir / ".locks").glob(f"n1.{job}.*")), "root's record left"


def _servers(pids: list[int]) -> list[int]:
    return [c.pid for p in pids for c in psutil.Process(p).children()]


# --- forged job files -------------------------------------------------------------------------
FORGED: dict[str, Any] = {
    "servers-text-pid": {"servers": [{"pid": "x", "start_time": 1}]},
    "servers-null": {"servers": None},
    "servers-number": {"servers": [1]},
    "pid-infinite": "1e400",
    "start-time-text": {"daemon_start_time": "x"},
    "pid-5000-digits": "9" * 5000,
    "escape-sequence": {"gpu_uuid": "\x1b]0;pwned\x07\x1b[2J", "user": "\x1b[31mroot"},
    "not-a-mapping": [1, 2, 3],
    "deep": "[" * 100000,
}


def _forge(path: Path, how: Any) -> str:
    """The text of ``path`` forged as ``how`` says: fields replaced, or a raw JSON text."""
    if isinstance(how, dict):
        data = json.loads(path.read_text())
        data.update(how)
        return json.dumps(data)
    if isinstance(how, list):
        return json.dumps(how)
    if how.startswith("["):
        return str(how)
    data = json.loads(path.read_text())
    return json.dumps(data).replace(f'"daemon_pid": {data["daemon_pid"]}', f'"daemon_pid": {how}')


@pytest.mark.parametrize("how", list(FORGED))
def test_a_forged_manifest_never_stops_the_epilog_or_roots_status(node: SimNode, how: str) -> None:
    """The job's user rewrites both GPUs' manifests with values of the wrong type, out of
    range, escape sequences, not a mapping, nested past any parser. Root's ``status`` and
    ``metrics`` still answer for the node (no exit 1, no escape sequence printed) and the
    epilog ends both daemons from root's record and removes the job: exit 0."""
    pids = _prolog(node)
    servers_before = _servers(pids)
    for key in ("g0", "g1"):
        path = admin_job(node) / key / "manifest.json"
        forged = node.root / f"forged-{key}.json"
        forged.write_text(_forge(path, FORGED[how]))
        forged.chmod(0o644)
        _as_user(f"cat {forged} > {path}.new && mv {path}.new {path}")
    for command in (["status"], ["status", "--json"], ["metrics"]):
        command += ["--node", "n1"]
        res = node.mpswrap(*command, MPSWRAP_CONFIG=str(node.root / "mpswrap.conf"))
        assert res.returncode in (0, 3), (command, res.returncode, res.stderr)
        assert "Traceback" not in res.stderr and "\x1b" not in res.stdout + res.stderr
    _epilog_within(node)
    _all_gone(node, pids + servers_before)


@pytest.mark.parametrize(
    "plant",
    [
        "printf '\\302\\262' > g0/pipe/nvidia-cuda-mps-control.pid",  # '²': isdigit, not int
        "printf '[2026-11-27 10:00:00.000 Control 1] Starting new server %s for user 0\\n' "
        f"{'9' * 5000} >> g0/log/control.log",
        "printf 'Client {PID: %s, Context ID: 1} encountered a fatal GPU error\\n' "
        f"{'٣' * 50} >> g0/log/server.log",
    ],
    ids=["pid-file-superscript", "log-5000-digit-pid", "log-arabic-digits"],
)
def test_numbers_that_isdigit_takes_and_int_refuses_are_ignored(node: SimNode, plant: str) -> None:
    pids = _prolog(node)
    job = admin_job(node)
    _as_user(f"cd {job} && rm -f g0/manifest.json && {plant}")
    _epilog_within(node)
    _all_gone(node, pids)


# --- a daemon the job user changed ------------------------------------------------------------
@pytest.mark.parametrize("cgroup", ["auto", "none"], ids=["cgroup", "record-only"])
def test_a_daemon_turned_into_another_program_is_ended_by_roots_record(
    node: SimNode, cgroup: str
) -> None:
    """The job's user makes their daemon exec a loop that respawns a child whenever it ends
    (what ptrace allows; here the simulator's ``become_on`` fault), points the manifest at
    PID 1, and removes the pid file and the logs. Nothing the job user wrote names the
    process; root's cgroup (or, without one, its record's PID and start time and the process
    tree) does: the epilog ends it, its respawned children and its server, and exits 0."""
    admin_config(node, cgroup_root=cgroup)
    pids = _prolog(node)
    if cgroup == "auto":
        assert all(str(member_of(p)).startswith("/mpswrap/") for p in pids)
    env = basics(
        CUDA_MPS_PIPE_DIRECTORY=str(admin_job(node) / "g0" / "pipe"),
        CUDA_MPS_LOG_DIRECTORY=str(admin_job(node) / "g0" / "log"),
    )
    uid = pwd.getpwnam(_user()).pw_uid
    run_as(_user(), [node.control], env, input=f"start_server -uid {uid}\n")
    node.faults.write_text(json.dumps({"become_on": ["get_client_list"]}))
    # The daemon execs as it takes the command: nothing answers the client, which gives up.
    run_as(_user(), ["timeout", "2", node.control, "get_client_list", "1"], env)
    node.faults.unlink()
    daemon = psutil.Process(pids[0])
    _wait(lambda: "subprocess" in " ".join(daemon.cmdline()), "the daemon to become a loop")
    tree = [daemon.pid, *(c.pid for c in daemon.children(recursive=True))]
    manifest = admin_job(node) / "g0" / "manifest.json"
    forged = json.loads(manifest.read_text()) | {"daemon_pid": 1, "servers": []}
    (node.root / "m.json").write_text(json.dumps(forged))
    (node.root / "m.json").chmod(0o644)
    job = admin_job(node)
    _as_user(f"cat {node.root}/m.json > {manifest} && rm -f {job}/g0/pipe/*.pid {job}/g0/log/*")
    _epilog_within(node)
    _all_gone(node, pids + tree)
    assert 1 in psutil.pids() and psutil.Process(1).is_running()


@pytest.mark.parametrize("cgroup", ["auto", "none"], ids=["cgroup", "record-only"])
@pytest.mark.parametrize("what", ["daemon", "daemon-and-server"])
def test_a_daemon_its_user_stopped_is_still_ended_within_the_deadline(
    node: SimNode, cgroup: str, what: str
) -> None:
    """The job's user stops their daemon (SIGSTOP; a ptrace stop is the same to root), and
    its server too: no command is answered, every polite step waits its whole timeout. They
    leave the forced end its share of the deadline: ``cgroup.kill``, or SIGKILL (which ends a
    stopped process), so the epilog exits 0 in time with nothing left. It once used the whole
    deadline on the polite steps, signalled nothing, and exited 1 (the node drained), and
    without a cgroup the daemon outlived every epilog of the job."""
    admin_config(node, teardown_deadline=str(DEADLINE), command_timeout="3", cgroup_root=cgroup)
    (daemon,) = _prolog(node, gpus="0")
    env = basics(
        CUDA_MPS_PIPE_DIRECTORY=str(admin_job(node) / "g0" / "pipe"),
        CUDA_MPS_LOG_DIRECTORY=str(admin_job(node) / "g0" / "log"),
    )
    uid = pwd.getpwnam(_user()).pw_uid
    run_as(_user(), [node.control], env, input=f"start_server -uid {uid}\n")
    servers = _servers([daemon])
    assert len(servers) == 1, servers
    stopped = [daemon, *(servers if what == "daemon-and-server" else [])]
    _as_user(f"kill -STOP {' '.join(map(str, stopped))}")
    _wait(lambda: all(psutil.Process(p).status() == "stopped" for p in stopped), "the stop")
    # Root's status: every command times out, and the failure names the job's pipe, never
    # the folder root pinned the socket in (whose name no other user may learn).
    pins = os.listdir(node.run_dir / ".control")
    said = _root_says(node)
    assert said.returncode == 3, said
    assert "g0/pipe" in said.stdout + said.stderr, said
    assert not any(pin in said.stdout + said.stderr for pin in pins), said
    took, _ = _epilog_within(node)
    assert took < DEADLINE + SLACK, took
    _all_gone(node, [daemon, *servers])


def _wait(done: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if done():
                return
        except psutil.Error:
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# --- work the job user multiplies -------------------------------------------------------------
FAKE_SOCKET = textwrap.dedent(
    """
    import json, os, socket, sys, time
    path, pids = sys.argv[1], [str(4000000 + i) for i in range(60)]
    os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    while True:
        conn, _ = listener.accept()
        conn.recv(65536)
        time.sleep(1.0)  # every answer late
        conn.sendall(json.dumps({"stdout": "\\n".join(pids), "stderr": "", "rc": 0}).encode()
                     + b"\\n")
        conn.close()
    """
)


def _multiply(node: SimNode, what: str, size: int) -> list[subprocess.Popen[str]]:
    """Make the job's user multiply ``what`` to ``size``; what they leave running."""
    job = admin_job(node)
    if what == "gpu-dirs":
        _as_user(f"cd {job} && for i in $(seq 2 {size + 1}); do mkdir g$i; done")
    elif what == "log-size":
        line = "[" + " " * 20000
        script = f"for i in $(seq {size}); do echo '{line}'; done"
        _as_user(f"cd {job}/g0/log && ({script}) > control.log && cp control.log server.log")
    elif what == "depth":
        _as_user(
            f"cd {job}/g0/log && for i in $(seq {size}); do mkdir d && cd d; done && "
            "head -c 50000000 /dev/zero > big"
        )
    elif what == "clients-listed":
        fake_socket = node.root / "fake_socket.py"
        fake_socket.write_text(FAKE_SOCKET)
        fake_socket.chmod(0o644)
        control = job / "g0" / "pipe" / "control"
        real = control.stat().st_ino
        fake = spawn_as(_user(), ["/usr/bin/python3", str(fake_socket), str(control)])
        _wait(lambda: control.is_socket() and control.stat().st_ino != real, "the fake socket")
        take_over_socket(node, "101", control)
        return [fake]
    return []


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("what", "sizes"),
    [
        ("gpu-dirs", (10, 999)),
        ("log-size", (10, 300)),
        ("depth", (10, 70)),
        ("clients-listed", (60, 60)),
    ],
)
def test_the_epilog_stays_within_its_deadline_whatever_the_job_user_multiplies(
    node: SimNode, what: str, sizes: tuple[int, int]
) -> None:
    """GPU directories, log lines that cost a backtracking parser quadratic time, a deep tree
    with a large file in it, a control socket that lists 60 clients that do not exist and
    answers every command a second late: at a small and a large size, the epilog ends the
    daemons and leaves nothing of the job in run_dir within its deadline (teardown_deadline =
    8 s, plus what starting Python on a loaded machine adds). The figures are printed."""
    admin_config(node, teardown_deadline=str(DEADLINE), command_timeout="3")
    for size in sizes:
        pids = _prolog(node)
        left = _multiply(node, what, size)
        try:
            took, said = _epilog_within(node)
        finally:
            for proc in left:
                proc.kill()
                proc.communicate(timeout=30)
        print(f"{what} x{size}: epilog {took:.2f} s")
        assert took < DEADLINE + SLACK, said
        _all_gone(node, pids)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("archive", [False, True])
def test_short_log_lines_keep_the_deadline_and_leave_nothing(node: SimNode, archive: bool) -> None:
    """Both logs of both GPUs made of 8 MiB of empty lines (8 million lines each): root reads
    a bounded tail of each log once, copies the archive's bytes, and the epilog ends the
    daemons and leaves nothing, root's cgroup included, within its deadline."""
    extra = {"log_archive": str(node.root / "archive")} if archive else {}
    admin_config(node, teardown_deadline=str(DEADLINE), command_timeout="3", **extra)
    pids = _prolog(node)
    for key in ("g0", "g1"):
        log = admin_job(node) / key / "log"
        _as_user(
            f"head -c {8 << 20} /dev/zero | tr '\\0' '\\n' > {log}/server.log "
            f"&& cp {log}/server.log {log}/control.log"
        )
    took, said = _epilog_within(node)
    print(f"8 MiB of empty log lines, archive {archive}: epilog {took:.2f} s")
    assert took < DEADLINE + SLACK, said
    _all_gone(node, pids)
    assert not _cgroups_of(node)


MANY_LINKS = textwrap.dedent(
    """
    import os, sys
    where, n = sys.argv[1], int(sys.argv[2]); os.mkdir(where); k = 0
    while k < n:
        src = f"{where}/f{k}"; open(src, "w").close(); k += 1
        for _ in range(60000):
            if k >= n: break
            os.link(src, f"{where}/f{k}"); k += 1
    """
)
#: Names in one directory: what the epilog took 18 s to remove before it looked at its
#: deadline while removing (3 s here), and take no inode (hard links).
MANY = 800_000


@pytest.mark.timeout(900)
def test_many_names_in_one_directory_keep_the_deadline(node: SimNode) -> None:
    """800,000 names in one directory of the job's: each epilog ends within its deadline,
    names the directory it could not empty in time, and leaves none of root's own state; the
    next epilog of the job goes on where it stopped, until nothing is left."""
    deadline = 3.0
    admin_config(node, teardown_deadline=str(deadline), command_timeout="3")
    pids = _prolog(node, gpus="0")
    script = node.root / "many.py"
    script.write_text(MANY_LINKS)
    script.chmod(0o644)
    where = admin_job(node) / "g0/log/many"
    res = run_as(_user(), ["/usr/bin/python3", str(script), str(where), str(MANY)], timeout=900)
    assert res.returncode == 0, res.stderr
    for _ in range(10):
        took, said = _epilog_within(node)
        print(f"{MANY} names: epilog {took:.2f} s")
        assert took < deadline + SLACK, took
        assert not list((node.run_dir / ".locks").glob("n1.101.*")) and not _cgroups_of(node)
        if not admin_job(node).exists():
            break
        assert "not emptied within the teardown's deadline" in said, said
    _all_gone(node, pids)


KEEPER = textwrap.dedent(
    """
    import os, sys
    where, k = sys.argv[1], 0
    while True:  # the same 1,000 names again and again: no disk fills up
        try:
            os.mkdir(f"{where}/e{k % 1000}")
        except FileNotFoundError:
            try:
                os.mkdir(where)
            except OSError:
                pass
        except OSError:
            pass
        k += 1
    """
)


def test_roots_own_state_goes_when_the_job_user_keeps_files_from_removal(node: SimNode) -> None:
    """Three processes of the job's user make directories in the job's log directory all
    through the epilog: the daemon is ended, the tree is left behind and named (exit 0), and root's
    own state goes all the same: its lock file and its cgroup. Once those processes are
    gone, the next epilog of the job removes the rest."""
    admin_config(node, teardown_deadline=str(DEADLINE), command_timeout="3")
    pids = _prolog(node, gpus="0")
    script = node.root / "keeper.py"
    script.write_text(KEEPER)
    script.chmod(0o644)
    log = admin_job(node) / "g0" / "log"
    keepers = [
        spawn_as(_user(), ["/usr/bin/python3", str(script), str(log / f"d{n}")]) for n in range(3)
    ]
    try:
        _wait(lambda: all((log / f"d{n}" / "e999").exists() for n in range(3)), "their files")
        took, said = _epilog_within(node)
        print(f"files made during the epilog: epilog {took:.2f} s")
        assert took < DEADLINE + SLACK, said
        assert "left behind after teardown" in said and str(admin_job(node)) in said, said
        assert all(gone(pid) for pid in pids)
        assert not list((node.run_dir / ".locks").glob("n1.101.*")), "root's record left"
        assert not _cgroups_of(node)
    finally:
        for keeper in keepers:
            keeper.kill()
            keeper.communicate(timeout=30)
    _epilog_within(node)
    _all_gone(node, pids)


# --- other jobs, other processes --------------------------------------------------------------
def test_another_job_of_the_same_user_is_never_ended_by_this_jobs_epilog(node: SimNode) -> None:
    """Two jobs of one user on one node. A process of job 102 names job 101's pipe directory
    in its environment, once as ``OLDPWD`` after a ``cd`` and once as its very MPS variable
    (``--export=ALL`` from inside a rank of 101). Job 101's epilog ends 101's daemon, and
    neither that process nor 102's daemon."""
    pids_a = _prolog(node, job="101", gpus="0")
    pids_b = _prolog(node, job="102", gpus="1")
    pipe_a = str(admin_job(node, "101") / "g0" / "pipe")
    theirs = [
        spawn_as(_user(), ["sleep", "300"], OLDPWD=pipe_a, SLURM_JOB_ID="102"),
        spawn_as(_user(), ["sleep", "301"], CUDA_MPS_PIPE_DIRECTORY=pipe_a, SLURM_JOB_ID="102"),
    ]
    try:
        _epilog_within(node, job="101")
        _all_gone(node, pids_a, job="101")
        assert all(p.poll() is None for p in theirs), "job 102's process was ended"
        assert not any(gone(pid) for pid in pids_b)
    finally:
        for proc in theirs:
            proc.kill()
            proc.communicate(timeout=30)
    _epilog_within(node, job="102")
    _all_gone(node, pids_b, job="102")


_RELAY_SOCKET = textwrap.dedent(
    """
    import os, socket, sys
    # Every command on argv[1] relayed to the socket argv[2], its answer back; each written
    # down in the file argv[3].
    path, target, said = sys.argv[1:4]
    os.unlink(path)
    lst = socket.socket(socket.AF_UNIX)
    lst.bind(path)
    lst.listen(64)
    while True:
        conn, _ = lst.accept()
        out = socket.socket(socket.AF_UNIX)
        try:
            out.connect(target)
            data = b""
            while not data.endswith(b"\\n"):
                c = conn.recv(65536)
                if not c:
                    break
                data += c
            with open(said, "ab") as log:
                log.write(data)
            out.sendall(data)
            out.shutdown(socket.SHUT_WR)
            while c := out.recv(65536):
                conn.sendall(c)
        except OSError:
            pass
        out.close()
        conn.close()
    """
)


_LISTENER = textwrap.dedent(
    """
    import socket, sys, time
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(sys.argv[1])
    listener.listen(8)
    time.sleep(300)
    """
)


def test_a_socket_the_job_user_swapped_in_before_roots_pin_is_not_pinned() -> None:
    """The moment between the daemon's first answer and root's pin: the job user (from
    another of their jobs on the node) puts a socket of their own, a relay say, in the pipe
    directory. The kernel names its listener, which is not the daemon root started: root
    pins nothing, and sends that daemon no command (the teardown ends it through its cgroup).
    The same socket listened on by the daemon's PID is pinned: the listener alone decided."""
    user = pwd.getpwnam(_user())
    top = Path(tempfile.mkdtemp(prefix="mpswrap-pin-", dir="/tmp"))
    top.chmod(0o755)
    pipe = top / "pipe"
    pipe.mkdir(mode=0o700)
    os.chown(pipe, user.pw_uid, user.pw_gid)
    relay = spawn_as(_user(), [sys.executable, "-c", _LISTENER, str(pipe / "control")])
    daemon = spawn_as(_user(), ["sleep", "300"])  # the daemon, as root's cgroup names it
    try:
        _wait((pipe / "control").is_socket, "the job user's socket")
        assert pin_control(pipe, top / ".control", user.pw_uid, daemon.pid) is None
        assert os.listdir(top / ".control") == []
        assert pin_control(pipe, top / ".control", user.pw_uid, relay.pid) is not None
    finally:
        for proc in (relay, daemon):
            proc.kill()
            proc.communicate(timeout=30)
        shutil.rmtree(top)


@pytest.mark.parametrize("how", ["symlink", "hard-link", "relay"])
def test_a_control_socket_swapped_for_a_way_to_another_jobs_daemon_carries_no_command_there(
    node: SimNode, how: str
) -> None:
    """Two jobs of one user. In job 101 the user replaces g0's control socket with a way to
    job 102's daemon (on GPU 1): a symbolic link, a hard link (a socket may have several), or
    a socket of its own that relays every command there. Root's epilog of 101 sends its commands
    through the socket root pinned when 101's daemon started: 101's daemon is ended, 102's
    daemon and its client run on, untouched."""
    pids_a = _prolog(node, job="101", gpus="0")
    pids_b = _prolog(node, job="102", gpus="1")
    g0_a, g1_b = admin_job(node, "101") / "g0", admin_job(node, "102") / "g1"
    client = spawn_as(
        _user(),
        [node.client, "--seconds", "300"],
        CUDA_MPS_PIPE_DIRECTORY=str(g1_b / "pipe"),
        CUDA_MPS_LOG_DIRECTORY=str(g1_b / "log"),
        SLURM_JOB_ID="102",
    )
    relay, relayed = None, node.root / "relayed"
    relayed.touch()
    try:
        _wait(lambda: "NEW CLIENT" in (g1_b / "log" / "control.log").read_text(), "a client")
        theirs, ours = g1_b / "pipe" / "control", g0_a / "pipe" / "control"
        if how == "relay":
            entry = pwd.getpwnam(_user())
            os.chown(relayed, entry.pw_uid, entry.pw_gid)
            args = [str(theirs), str(relayed)]
            relay = _fake_socket(node, _RELAY_SOCKET, args, take_over=False)
        else:
            link = "ln -s" if how == "symlink" else "ln"
            _as_user(f"cd {ours.parent} && mv control control.orig && {link} {theirs} control")
        _epilog_within(node, job="101")
        _all_gone(node, pids_a, job="101")
        assert not relayed.read_bytes(), relayed.read_bytes()  # no command of root's
        assert client.poll() is None, "job 102's client was ended"
        assert not any(gone(pid) for pid in [*pids_b, *_servers(pids_b)]), "102's MPS ended"
        said = node.mpswrap("status", "--node", "n1", "--job", "102")
        assert said.returncode == 0 and "clients 1" in said.stdout, said.stdout + said.stderr
    finally:
        for proc in (relay, client):
            if proc is not None:
                proc.kill()
                proc.communicate(timeout=30)
    _epilog_within(node, job="102")
    _all_gone(node, pids_b, job="102")


def test_another_user_can_neither_list_nor_name_roots_pinned_sockets(node: SimNode) -> None:
    """The sockets root pins are reachable by no one the job's 0700 pipe directory keeps
    out: their folder's name is random, in a folder of root's that no other user may list."""
    pids = _prolog(node, gpus="0")
    pins = node.run_dir / ".control"
    (pin,) = os.listdir(pins)
    assert len(pin) == 16 and oct(os.lstat(pins).st_mode & 0o777) == "0o711"
    for user in (ensure_other_user(), _user()):
        listed = run_as(user, ["ls", str(pins)])
        assert listed.returncode != 0 and pin not in listed.stdout, (user, listed.stdout)
    _epilog_within(node)
    _all_gone(node, pids)
    assert os.listdir(pins) == []


def test_a_job_of_uid_0_gets_no_mps(node: SimNode) -> None:
    """A root daemon would serve it, and its teardown would act on root's processes."""
    res = slurm_hook(node, "prolog", user="root")
    assert res.returncode == 0, res.stderr
    assert "a job of uid 0 gets no MPS" in res.stderr, res.stderr
    assert not admin_job(node).exists()
    end = slurm_hook(node, "epilog", user="root")
    assert end.returncode == 0 and "Traceback" not in end.stderr, end.stderr


def test_a_thread_policy_past_floats_is_one_line(node: SimNode) -> None:
    """``--mps=1e308:1`` (what the SPANK plugin passes as SPANK_MPSWRAP_MPS): the prolog
    starts the daemons and names the bad policy; ``run --threads 1e308:1`` is a usage error."""
    pids = _prolog(node, SPANK_MPSWRAP_MPS="1e308:1")
    res = node.mpswrap("run", "-n", "2", "--threads", "1e308:1", "--", "true")
    assert res.returncode == 2, res.stderr
    assert "argument --threads: invalid value '1e308:1'" in res.stderr, res.stderr
    assert "internal error" not in res.stderr
    _epilog_within(node)
    _all_gone(node, pids)


def test_roots_status_prints_no_escape_sequence_of_a_clients_command_line(
    node: SimNode,
) -> None:
    pids = _prolog(node, gpus="0")
    g0 = admin_job(node) / "g0"
    # Its command line holds a terminal's title and clear-screen sequences.
    program = f"{sys.executable} -m mpswrap.sim.client --seconds 60"
    client = spawn_as(
        _user(),
        ["/bin/bash", "-c", f'exec {program} --tag "$(printf "\\033]0;owned\\007\\033[2J")"'],
        CUDA_MPS_PIPE_DIRECTORY=str(g0 / "pipe"),
        CUDA_MPS_LOG_DIRECTORY=str(g0 / "log"),
        PYTHONPATH=node.env()["PYTHONPATH"],
    )
    try:
        _wait(lambda: f"NEW CLIENT {client.pid} " in _read(g0 / "log" / "control.log"), "attach")
        res = node.mpswrap("status", "--node", "n1", MPSWRAP_CONFIG=str(node.root / "mpswrap.conf"))
        assert res.returncode == 0, res.stderr
        assert f"client {client.pid}" in res.stdout and "\x1b" not in res.stdout, res.stdout
    finally:
        _epilog_within(node)
        client.communicate(timeout=30)
    _all_gone(node, pids)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_a_squatted_tmp_root_is_refused_and_a_private_one_used(node: SimNode) -> None:
    """Another user makes ``/tmp/mpswrap-<uid>`` first: the user's run names it in one
    warning and runs in ``~/.mpswrap-run`` instead."""
    owner = ensure_user("mpswhome", home=True)
    squat = Path(f"/tmp/mpswrap-{pwd.getpwnam(owner).pw_uid}")
    made = run_as(ensure_other_user(), ["mkdir", "-m", "0777", str(squat)])
    assert made.returncode == 0 or squat.is_dir(), made.stderr
    try:
        env = {k: v for k, v in node.env().items() if k != "MPSWRAP_USER_RUN_DIR"}
        res = run_as(owner, [sys.executable, "-m", "mpswrap", "run", "-n", "1", "--", "true"], env)
        assert res.returncode == 0, res.stderr
        assert f"{squat} is not yours (owned by uid" in res.stderr, res.stderr
        assert "/.mpswrap-run" in res.stderr
    finally:
        subprocess.run(["rm", "-rf", str(squat)], check=False)


def test_an_admin_file_past_its_size_is_one_line_at_once(node: SimNode) -> None:
    big = node.root / "mpswrap.conf"
    with big.open("a") as out:
        out.write("# " + "x" * (2 << 20) + "\n")
    took = time.monotonic()
    res = slurm_hook(node, "prolog")
    assert time.monotonic() - took < 10
    assert res.returncode == 0 and "larger than 1 MiB" in res.stderr, res.stderr
    assert not admin_job(node).exists()


# --- what root's status prints --------------------------------------------------------------
def _root_says(node: SimNode, *command: str) -> subprocess.CompletedProcess[str]:
    """Root's ``command`` (``status`` unless named) for the node, with the test's admin file."""
    argv = [*(command or ["status"]), "--node", "n1"]
    return node.mpswrap(*argv, MPSWRAP_CONFIG=str(node.root / "mpswrap.conf"))


def test_a_fault_stamp_in_server_log_prints_no_escape(node: SimNode) -> None:
    """The job's user appends a fatal error to server.log whose stamp is an escape sequence:
    root's ``status`` prints the fault, and the unhealthy line for it, escaped."""
    pids = _prolog(node, gpus="0")
    src = node.root / "planted"
    src.write_text(
        "[\x1b[2J\x1b[31mPWNED Server 1234] Client {PID: 5678, Context ID: 1} "
        "encountered a fatal GPU error\n"
    )
    src.chmod(0o644)
    _as_user(f"cat {src} >> {admin_job(node)}/g0/log/server.log")
    res = _root_says(node)
    _epilog_within(node)
    _all_gone(node, pids)
    assert "FAULT at" in res.stdout and "PWNED" in res.stderr, res.stdout + res.stderr
    assert "\x1b" not in res.stdout + res.stderr, repr(res.stdout + res.stderr)


_SAYING_SOCKET = textwrap.dedent(
    """
    import json, os, socket, sys, time
    # Each command answered as argv[2] says: command prefix -> [stdout, stderr, rc] and, at
    # the end, seconds to wait first; the longest prefix that matches; "" answers the rest.
    path, said = sys.argv[1], json.loads(sys.argv[2])
    os.unlink(path)
    lst = socket.socket(socket.AF_UNIX)
    lst.bind(path)
    lst.listen(64)
    while True:
        conn, _ = lst.accept()
        data = b""
        while not data.endswith(b"\\n"):
            c = conn.recv(65536)
            if not c:
                break
            data += c
        cmd = json.loads(data or b'{"cmd": ""}')["cmd"]
        key = max((k for k in said if cmd.startswith(k)), key=len, default=None)
        out, err, rc, *delay = said[key] if key is not None else ("", "", 0)
        time.sleep(delay[0] if delay else 0)
        try:
            conn.sendall(json.dumps({"stdout": out, "stderr": err, "rc": rc}).encode() + b"\\n")
        except OSError:
            pass
        conn.close()
    """
)


def _saying(node: SimNode, said: dict[str, tuple[Any, ...]]) -> subprocess.Popen[str]:
    return _fake_socket(node, _SAYING_SOCKET, [json.dumps(said)])


def _status_socket(
    node: SimNode, n: int, delay: float, status: str, servers: list[int] | None = None
) -> subprocess.Popen[str]:
    """The job's user answers on g0's control socket in the simulator's protocol: ``n``
    servers (``servers``, or ``n`` PIDs of nothing), each command about one of them after
    ``delay`` seconds, its status ``status``."""
    listed = servers or [3000000 + i for i in range(n)]
    return _saying(
        node,
        {
            "get_server_list": ("\n".join(map(str, listed)), "", 0),
            "get_default_active": ("100", "", 0),
            "get_server_status": (status, "", 0, delay),
            "get_active_thread": ("50", "", 0, delay),
            "": ("", "", 0, delay),
        },
    )


def _fake_socket(
    node: SimNode, script_text: str, args: list[str], take_over: bool = True
) -> subprocess.Popen[str]:
    """The job's user puts the program ``script_text`` on g0's control socket (``args``
    after the socket's path): the process, once the socket is its; ``take_over``: and the
    one root's commands reach (``take_over_socket``)."""
    script = node.root / "fake.py"
    script.write_text(script_text)
    script.chmod(0o644)
    control = admin_job(node) / "g0" / "pipe" / "control"
    real = control.stat().st_ino
    proc = spawn_as(_user(), ["/usr/bin/python3", str(script), str(control), *args])
    _wait(lambda: control.is_socket() and control.stat().st_ino != real, "the fake socket")
    if take_over:
        take_over_socket(node, "101", control)
    return proc


def _real_server(node: SimNode, job: str = "101") -> int:
    """A server the job's daemon really starts for the job's user (before any fake socket):
    its PID, a server root's record and cgroup hold."""
    g0 = admin_job(node, job) / "g0"
    env = basics(CUDA_MPS_PIPE_DIRECTORY=str(g0 / "pipe"), CUDA_MPS_LOG_DIRECTORY=str(g0 / "log"))
    uid = pwd.getpwnam(_user()).pw_uid
    started = run_as(_user(), [node.control], env, input=f"start_server -uid {uid}\n")
    assert started.returncode == 0, started.stderr
    listed = run_as(_user(), [node.control], env, input="get_server_list\n")
    return int(listed.stdout.split()[0])


def test_a_server_status_from_the_socket_prints_no_escape(node: SimNode) -> None:
    """The job's user answers ``get_server_status`` with an escape sequence: root's
    ``status`` names the server as not healthy, escaped, on stdout and in its log line."""
    pids = _prolog(node, gpus="0")
    server = _real_server(node)
    fake = _status_socket(node, 2, 0.0, "\x1b[2J\x1b]0;pwned\x07", [server])
    try:
        res = _root_says(node)
    finally:
        fake.kill()
        fake.communicate(timeout=30)
    _epilog_within(node)
    _all_gone(node, pids)
    assert res.returncode == 3 and f"server {server} is" in res.stderr, res.stderr
    assert "\x1b" not in res.stdout + res.stderr, repr(res.stdout + res.stderr)


def test_a_run_record_nested_past_any_parser_never_breaks_roots_status(node: SimNode) -> None:
    """The job's user writes a run record of 20,000 nested lists: root's ``status``,
    ``status --json`` and ``metrics`` skip it, never an internal error."""
    pids = _prolog(node, gpus="0")
    src = node.root / "deep.json"
    src.write_text("[" * 20000 + "]" * 20000)
    src.chmod(0o644)
    folder = admin_job(node) / "outcomes"
    _as_user(f"mkdir -p {folder} && cat {src} > {folder}/1-0000000a.json")
    said = [_root_says(node, *command) for command in (["status"], ["status", "--json"])]
    said.append(_root_says(node, "metrics"))
    _epilog_within(node)
    _all_gone(node, pids)
    for res in said:
        assert res.returncode in (0, 3), (res.args, res.returncode, res.stderr)
        assert "internal error" not in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.timeout(300)
def test_roots_status_and_metrics_end_within_their_deadline_whatever_a_socket_lists(
    node: SimNode,
) -> None:
    """The job's user answers on g0's control socket, listing the daemon's server 64 times
    and answering each command about one 0.8 s late (unbounded, ~150 s): root's ``status``
    and ``metrics`` end within their one deadline (``report.status.DEADLINE``, plus starting
    Python on a loaded machine), what was not answered is "not answered in time", and
    ``status`` exits 3."""
    pids = _prolog(node, gpus="0")
    fake = _status_socket(node, 64, 0.8, "ACTIVE", [_real_server(node)] * 64)
    try:
        took = []
        for command in (["status"], ["metrics"]):
            start = time.monotonic()
            res = _root_says(node, *command)
            took.append(time.monotonic() - start)
            assert res.returncode == (3 if command == ["status"] else 0), res.stderr
            assert "internal error" not in res.stderr, res.stderr
            said = "not answered in time" if command == ["status"] else "mpswrap_daemon_up{"
            assert said in res.stdout + res.stderr, res.stdout
    finally:
        fake.kill()
        fake.communicate(timeout=30)
    print(f"status {took[0]:.1f} s, metrics {took[1]:.1f} s")
    assert max(took) < STATUS_DEADLINE + SLACK, took
    _epilog_within(node)
    _all_gone(node, pids)


# --- job files that are no file: directories where a file should be, records by the thousand
def test_a_log_that_is_a_directory_never_breaks_roots_status_or_the_teardown(
    node: SimNode,
) -> None:
    """The job user makes server.log and control.log directories: root's ``status`` and
    ``metrics`` pass them over, and the epilog's ladder still runs (terminate_client, quit)
    instead of ending the daemon by signal after an internal error."""
    pids = _prolog(node, gpus="0")
    _as_user(
        f"cd {admin_job(node)}/g0/log && rm -f server.log control.log "
        "&& mkdir server.log control.log"
    )
    said = [_root_says(node, *c) for c in (["status"], ["status", "--json"], ["metrics"])]
    _, stderr = _epilog_within(node)
    _all_gone(node, pids)
    for res in said:
        assert res.returncode in (0, 3) and "internal error" not in res.stderr, res.stderr
    assert "internal error" not in stderr and "teardown failed" not in stderr, stderr


@pytest.mark.parametrize(
    "record", ["directory", '[{"code": true, "attached": null}]'], ids=["directory", "bool-code"]
)
def test_a_run_record_that_is_no_record_never_breaks_roots_status(
    node: SimNode, record: str
) -> None:
    pids = _prolog(node, gpus="0")
    folder = admin_job(node) / "outcomes"
    if record == "directory":
        _as_user(f"mkdir -p {folder}/1-0000000a.json")
    else:
        src = node.root / "rec.json"
        src.write_text(record)
        src.chmod(0o644)
        _as_user(f"mkdir -p {folder} && cat {src} > {folder}/1-0000000a.json")
    said = [_root_says(node, *c) for c in (["status"], ["status", "--json"], ["metrics"])]
    _epilog_within(node)
    _all_gone(node, pids)
    for res in said:
        assert res.returncode in (0, 3) and "internal error" not in res.stderr, res.stderr


def test_thousands_of_run_records_keep_roots_status_short_and_quiet(node: SimNode) -> None:
    """Root's ``status`` reads ``outcomes.PEEK_LIMIT`` records at most, within its deadline,
    and says nothing of each one that is no record (5,000 empty ones: 5,000 warnings)."""
    pids = _prolog(node, gpus="0")
    folder = admin_job(node) / "outcomes"
    _as_user(f"mkdir -p {folder} && cd {folder} && seq -f '%g-0000000a.json' 5000 | xargs touch")
    start = time.monotonic()
    res = _root_says(node)
    took = time.monotonic() - start
    _epilog_within(node)
    _all_gone(node, pids)
    assert res.returncode in (0, 3) and "skipping" not in res.stderr, res.stderr[-2000:]
    assert took < STATUS_DEADLINE + SLACK, took


def test_farm_status_of_a_state_file_that_is_a_directory_is_one_line(node: SimNode) -> None:
    (node.root / "farm" / "state.jsonl").mkdir(parents=True)
    res = node.mpswrap("farm", "status", str(node.root / "farm"))
    assert res.returncode == 2 and "internal error" not in res.stderr, res.stderr


def test_roots_metrics_prints_no_carriage_return_of_a_user_mode_manifest(node: SimNode) -> None:
    """A user-mode job's manifest is its user's: a carriage return in it reaches no terminal
    (escaped in the label), and the ``user`` label is the directory's owner, never the
    manifest's word."""
    user = _user()
    res = node.mpswrap("start", "--job", "j1", "--node", "n1", "--gpus", "0", user=user)
    assert res.returncode == 0, res.stderr
    manifest = node.user_run_dir / "n1" / "j1" / "g0" / "manifest.json"
    forged = json.loads(manifest.read_text()) | {"user": "root\rmpswrap_jobs 99"}
    src = node.root / "m.json"
    src.write_text(json.dumps(forged))
    src.chmod(0o644)
    run_as(user, ["sh", "-c", f"cat {src} > {manifest}"])
    out = subprocess.run(
        [sys.executable, "-m", "mpswrap", "metrics", "--node", "n1"],
        capture_output=True,
        env=node.env(MPSWRAP_CONFIG=str(node.root / "mpswrap.conf")),
        cwd=node.root,
        timeout=60,
    )
    assert node.mpswrap("stop", "--job", "j1", "--node", "n1", user=user).returncode == 0
    assert out.returncode == 0, out.stderr
    assert b"\r" not in out.stdout, [ln for ln in out.stdout.split(b"\n") if b"\r" in ln]
    assert f'user="{user}"'.encode() in out.stdout and b'user="root' not in out.stdout


# --- what root's stop, status and metrics take from the socket, and whose code they run ------
def _end(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        proc.kill()
        proc.communicate(timeout=30)


def test_roots_stop_prints_no_escape_sequence_of_a_control_reply(node: SimNode) -> None:
    """The job's user answers every command on g0's socket with a terminal's title and colour
    sequences: root's ``mpswrap stop`` of the job names the reply, escaped."""
    pids = _prolog(node, gpus="0")
    fake = _saying(node, {"": ("", "\x1b]0;pwned\x07\x1b[31mred", 1)})
    try:
        res = _root_says(node, "stop", "--job", "101")
    finally:
        _end(fake)
    _epilog_within(node)
    _all_gone(node, pids)
    said = res.stdout + res.stderr
    assert "pwned" in said and "\x1b" not in said, repr(said)


def test_roots_stop_of_the_node_bounds_a_users_own_teardown(node: SimNode) -> None:
    """A user-mode job directory of the test user on the node: root's ``mpswrap stop`` of the
    whole node, which has no deadline of its own, runs that user's own teardown within a
    bound and names the job, never an internal error."""
    # A node of its own: root's stop of a node looks at every user's trees for it.
    where = f"nstop{os.getpid()}"
    tree = node.user_run_dir / where / "109"
    _as_user(f"mkdir -p {tree} && chmod 700 {node.user_run_dir} {tree.parent} {tree}")
    res = node.mpswrap("stop", "--node", where, MPSWRAP_CONFIG=str(node.root / "mpswrap.conf"))
    assert "internal error" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 0 and f"job 109 on {where}" in res.stdout, res.stdout + res.stderr
    assert not tree.exists()


def sysconfig_paths() -> list[str]:
    """This interpreter's own package directories (a venv's site-packages)."""
    import sysconfig

    return list(dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]))


def test_the_sweep_of_a_users_tree_runs_none_of_that_users_own_python_code(
    node: SimNode,
) -> None:
    """The epilog ends a user-mode tree of the job's user by running that user's own
    ``mpswrap stop``, as them, with their HOME: a ``.pth`` file in their site directory, which
    runs in every Python they start, runs nowhere in that teardown."""
    owner = ensure_user("mpswsite", home=True)
    home = pwd.getpwnam(owner).pw_dir
    # An interpreter with user sites on, as a system Python or a venv with system site
    # packages has (a plain venv has none): a venv of this one's base, finding mpswrap and
    # its packages through PYTHONPATH as the hooks' teardown passes them on.
    made = subprocess.run(
        [
            getattr(sys, "_base_executable", sys.executable),
            "-m",
            "venv",
            "--system-site-packages",
            "--without-pip",
            str(node.root / "py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    python = str(node.root / "py" / "bin" / "python")
    paths = os.pathsep.join([str(REPO), *sysconfig_paths()])
    ask = [python, "-c", "import site; print(site.getusersitepackages())"]
    site = run_as(owner, ask, basics(HOME=home)).stdout.strip()
    marker = node.root / "ran"
    marker.touch(mode=0o666)
    marker.chmod(0o666)
    code = f"try:\n with open({str(marker)!r}, 'a') as f: f.write(' '.join(sys.argv) + '\\n')"
    pth = f"import sys; exec({code + chr(10) + 'except Exception: pass'!r})\n"
    src = node.root / "zz.pth"
    src.write_text(pth)
    src.chmod(0o644)
    try:
        run_as(owner, ["sh", "-c", f"mkdir -p {site} && cp {src} {site}/zz-mpswrap-test.pth"])
        run_as(owner, [python, "-c", "pass"], basics(HOME=home))
        assert marker.read_text(), "the .pth does not run in this user's Python: no test"
        marker.write_text("")
        tree = node.user_run_dir / "n1" / "101"
        run_as(owner, ["sh", "-c", f"mkdir -p {tree} && chmod 700 {tree.parent.parent} {tree}"])
        res = slurm_hook(node, "epilog", user=owner, gpus="0", python=python, PYTHONPATH=paths)
        assert res.returncode == 0, res.stderr
        assert not tree.exists(), res.stderr  # the user's own teardown ran
        assert marker.read_text() == "", marker.read_text()
    finally:
        run_as(owner, ["rm", "-f", f"{site}/zz-mpswrap-test.pth"])


def test_a_process_of_another_job_a_socket_lists_as_a_client_is_never_signalled(
    node: SimNode,
) -> None:
    """Without Slurm's cgroups (proctrack/linuxproc), the job's user runs a process of job 102
    (its ``SLURM_JOB_ID``), and job 101's control socket lists it as a client of 101's own
    server: 101's epilog may ask MPS to end it, and never signals it."""
    pids = _prolog(node, gpus="0")
    server = _real_server(node)
    victim = spawn_as(_user(), ["sleep", "300"], SLURM_JOB_ID="102")
    said = {"get_server_list": (str(server), "", 0), "get_client_list": (str(victim.pid), "", 0)}
    fake = _saying(node, said)
    try:
        _, stderr = _epilog_within(node)
        assert victim.poll() is None, f"job 102's process was signalled: {stderr}"
    finally:
        _end(fake, victim)
    _all_gone(node, pids)


def test_roots_status_and_metrics_show_only_the_daemons_servers_and_the_job_users_clients(
    node: SimNode,
) -> None:
    """The job's socket lists a server that is not the daemon's and, as a client of the
    daemon's own server, another user's process whose command line holds a secret: root's
    ``status``, ``status --json`` and ``metrics --process-labels`` show the daemon's server,
    and neither the stranger nor the other user's process."""
    pids = _prolog(node, gpus="0")
    server = _real_server(node)
    secret = "--password=hunter2-of-another-user"
    other = spawn_as(
        ensure_other_user(), [sys.executable, "-c", "import time; time.sleep(300)", secret]
    )
    said = {
        "get_server_list": (f"{server}\n4242", "", 0),
        "get_client_list": (str(other.pid), "", 0),
        "get_server_status": ("ACTIVE", "", 0),
        "get_active_thread_percentage": ("100", "", 0),
        "get_default_active_thread_percentage": ("100", "", 0),
    }
    _wait(lambda: secret in " ".join(psutil.Process(other.pid).cmdline()), "the other process")
    fake = _saying(node, said)
    try:
        shown = [
            _root_says(node, *c)
            for c in (["status"], ["status", "--json"], ["metrics", "--process-labels"])
        ]
    finally:
        _end(fake, other)
    _epilog_within(node)
    _all_gone(node, pids)
    assert f"server {server}" in shown[0].stdout, shown[0].stdout + shown[0].stderr
    assert "not the daemon's: not shown" in shown[0].stderr, shown[0].stderr
    for res in shown:
        assert "internal error" not in res.stderr, res.stderr
        assert secret not in res.stdout and str(other.pid) not in res.stdout, res.stdout
        assert "4242" not in res.stdout, res.stdout
