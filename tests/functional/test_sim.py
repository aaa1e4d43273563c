"""The MPS simulator (mpswrap.sim) behaves like the real driver where mpswrap can see it.

Every test drives the simulator through its wrapper scripts, as mpswrap does, in its own
temporary pipe and log directories. The ``sim`` fixture ends every process whose command line
or environment names the test's directory, and fails the test if any was still there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from mpswrap.sim.inventory import fake_inventory, write_inventory
from tests.procs import interruptible
from tests.simenv import SimFiles
from tests.waits import wait_until

pytestmark = pytest.mark.functional

GPU = "GPU-00000000-0000-4000-8000-000000000000"
NOT_RUNNING = "Cannot find MPS control daemon process"
BUSY = "Cannot send command to MPS control daemon process"


class Sim:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = SimFiles(root)
        self.files.install(gpus=1)
        self.faults, self.bin = self.files.faults, self.files.bin
        self.pipe, self.log = root / "pipe", root / "log"
        self.pipe.mkdir()
        self.log.mkdir()
        self.procs: list[subprocess.Popen[str]] = []

    @property
    def control(self) -> str:
        return self.files.control

    def env(self, pipe: Path | None = None, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            CUDA_MPS_PIPE_DIRECTORY=str(pipe or self.pipe),
            CUDA_MPS_LOG_DIRECTORY=str(self.log),
            CUDA_VISIBLE_DEVICES=GPU,
        )
        env.update(extra)
        return env

    def set_faults(self, **faults: Any) -> None:
        self.faults.write_text(json.dumps(faults))

    def ctl(self, line: str, timeout: float = 15) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.control],
            input=line + "\n",
            env=self.env(),
            text=True,
            capture_output=True,
            timeout=timeout,
        )

    def out(self, line: str) -> str:
        res = self.ctl(line)
        assert res.returncode == 0, (line, res.stderr)
        return res.stdout.strip()

    def start(self, *, wait: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [self.control, "-d"], env=self.env(), text=True, capture_output=True, timeout=15
        )
        deadline = time.monotonic() + 15
        while wait and self.ctl("get_server_list").returncode != 0:
            assert time.monotonic() < deadline, "daemon did not answer"
            time.sleep(0.02)
        return res

    def daemon_pid(self) -> int:
        return int((self.pipe / "nvidia-cuda-mps-control.pid").read_text())

    def client(self, *args: str, pipe: Path | None = None, **extra: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [self.files.client, *args],
            env=self.env(pipe, **extra),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def server(self, timeout: float = 15) -> int:
        deadline = time.monotonic() + timeout
        while not (out := self.out("get_server_list")):
            assert time.monotonic() < deadline, "no server"
            time.sleep(0.05)
        return int(out.split()[0])

    def wait_clients(self, server: int, count: int, timeout: float = 30) -> list[int]:
        deadline = time.monotonic() + timeout
        while len(pids := self.out(f"get_client_list {server}").split()) < count:
            assert time.monotonic() < deadline, f"only {pids} attached"
            time.sleep(0.05)
        return sorted(map(int, pids))

    def read_log(self, name: str) -> str:
        path = self.log / name
        return path.read_text() if path.exists() else ""

    def leftovers(self) -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if str(self.root) in " ".join(proc.info["cmdline"] or ()) or any(
                    str(self.root) in v for v in proc.environ().values()
                ):
                    found.append(proc)
            except psutil.Error:
                continue
        return found


@pytest.fixture
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    # A short root: unix socket paths are limited to 107 bytes.
    s = Sim(tmp_path_factory.mktemp("sim"))
    try:
        yield s
    finally:
        _teardown(s)


@pytest.fixture
def public_sim() -> Iterator[Sim]:
    """A Sim whose root other users can enter (pytest's own tmp root is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="mpswrap-sim-"))
    root.chmod(0o755)
    s = Sim(root)
    try:
        yield s
    finally:
        try:
            _teardown(s)
        finally:
            shutil.rmtree(root, ignore_errors=True)


def _teardown(s: Sim) -> None:
    """Kill clients, quit (bounded), then kill by PID whatever still names this test's dirs."""
    for proc in s.procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    s.set_faults()
    try:
        s.ctl("quit", timeout=10)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + 3
    while (left := s.leftovers()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for stray in left:
        try:
            stray.kill()
        except psutil.Error:
            pass
    assert not left, f"left behind: {[(p.pid, p.info['cmdline']) for p in left]}"


def _gone(pid: int, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while psutil.pid_exists(pid):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --- daemon life -------------------------------------------------------------------------
def test_daemon_starts_detached_answers_and_refuses_a_second(sim: Sim) -> None:
    none = sim.ctl("get_server_list")
    assert none.returncode == 1 and NOT_RUNNING in none.stderr
    started = time.monotonic()
    first = sim.start(wait=False)
    assert first.returncode == 0 and time.monotonic() - started < 5
    sim.start()
    assert sim.out("get_server_list") == ""
    pid = sim.daemon_pid()
    # Detached: its own session (not leading it: double fork), not our child, cwd /.
    assert os.getsid(pid) not in (os.getsid(0), pid)
    assert psutil.Process(pid).ppid() != os.getpid() and psutil.Process(pid).cwd() == "/"
    again = sim.start(wait=False)
    assert again.returncode == 1 and "An instance of this daemon is already running" in again.stderr
    bad = subprocess.run([sim.control, "-x"], env=sim.env(), text=True, capture_output=True)
    assert bad.returncode == 1 and bad.stderr
    log = sim.read_log("control.log")
    assert f"Control {pid:5d}] Starting control daemon using socket {sim.pipe}/control" in log
    assert sim.ctl("quit").returncode == 0
    assert not (sim.pipe / "nvidia-cuda-mps-control.pid").exists()
    assert _gone(pid)
    assert NOT_RUNNING in sim.ctl("get_server_list").stderr


def test_foreground_daemon_and_argv_commands(sim: Sim) -> None:
    proc = subprocess.Popen(
        [sim.control, "-f"],
        env=sim.env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    sim.procs.append(proc)
    deadline = time.monotonic() + 15
    while sim.ctl("get_server_list").returncode != 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert sim.daemon_pid() == proc.pid
    argv = subprocess.run(
        [sim.control, "get_default_active_thread_percentage"],
        env=sim.env(),
        text=True,
        capture_output=True,
        timeout=15,
    )
    assert argv.stdout == "100.0\n"
    assert sim.ctl("quit").returncode == 0
    assert proc.wait(10) == 0


def test_commands_and_defaults(sim: Sim) -> None:
    sim.start()
    assert sim.out("set_default_active_thread_percentage 25") == "25.0"
    assert sim.out("get_default_active_thread_percentage") == "25.0"
    assert sim.out("set_default_device_pinned_mem_limit 0 2G") == ""
    assert sim.out("get_default_device_pinned_mem_limit 0") == "2G"
    assert sim.out("set_default_client_priority 1") == ""
    assert sim.out("get_default_client_priority") == "1"
    assert sim.out("no_such_command") == 'Unknown command "no_such_command"'
    assert sim.out("get_client_list 1") == "Server 1 not found"
    assert sim.out("get_server_status 1") == "Server 1 not found"
    assert sim.ctl("set_default_active_thread_percentage 0").returncode == 1
    assert sim.ctl("set_default_active_thread_percentage 101").returncode == 1
    assert sim.out(f"start_server -uid {os.getuid()}") == ""
    server = sim.server()
    assert sim.out(f"start_server -uid {os.getuid()}") == ""  # idempotent
    assert sim.out("get_server_list") == str(server)
    assert sim.out(f"get_server_status {server}") == "ACTIVE"
    assert sim.out(f"get_active_thread_percentage {server}") == "25.0"
    assert sim.out(f"set_active_thread_percentage {server} 50") == "50.0"
    assert sim.out(f"get_active_thread_percentage {server}") == "50.0"
    assert sim.out(f"get_client_list {server}") == ""
    assert psutil.Process(server).ppid() == sim.daemon_pid()
    control, server_log = sim.read_log("control.log"), sim.read_log("server.log")
    assert f"Starting new server {server} for user {os.getuid()}" in control
    assert f"NEW SERVER {server}: Ready" in control
    assert "Active Threads Percentage set to 25.0" in server_log
    assert "Active Threads Percentage set to 50.0" in server_log
    daemon = sim.daemon_pid()
    assert sim.ctl("quit").returncode == 0
    assert _gone(server) and _gone(daemon)  # both exit after quit has answered
    assert f"Server {server} exited with status 0" in sim.read_log("control.log")


# --- clients -----------------------------------------------------------------------------
def test_clients_attach_are_listed_logged_and_recorded(sim: Sim) -> None:
    sim.start()
    record = sim.root / "record.jsonl"
    clients = [
        sim.client("--seconds", "3", "--record", str(record), "--tag", f"t{i}") for i in range(2)
    ]
    server = sim.server()
    assert sim.wait_clients(server, 2) == sorted(c.pid for c in clients)
    for c in clients:
        out, _ = c.communicate(timeout=30)
        assert c.returncode == 0, out
        assert f"mps-sim-client {c.pid} mode=mps server={server} started" in out
    events = [json.loads(line) for line in record.read_text().splitlines()]
    starts = [e for e in events if e["event"] == "start"]
    assert {e["tag"] for e in starts} == {"t0", "t1"}
    assert all(e["mode"] == "mps" and e["server_pid"] == server and e["cvd"] == GPU for e in starts)
    assert sorted(e["reason"] for e in events if e["event"] == "end") == ["done", "done"]
    log, control = sim.read_log("server.log"), sim.read_log("control.log")
    for c in clients:
        assert f"Client {{PID: {c.pid}, Context ID: 1}} connected" in log
        assert f"Client process {c.pid} disconnected" in log
        assert f"NEW CLIENT {c.pid} from user {os.getuid()}: " in control
    assert ": Server already exists" in control  # the second of the two
    assert sim.out(f"get_client_list {server}") == ""


def test_visible_devices_decide_attachment(sim: Sim) -> None:
    sim.start()
    ok = [sim.client("--seconds", "0.5", CUDA_VISIBLE_DEVICES=v) for v in ("0", GPU)]
    bad = sim.client("--seconds", "0.5", CUDA_VISIBLE_DEVICES="1")
    for c in ok:
        out, _ = c.communicate(timeout=30)
        assert c.returncode == 0 and "mode=mps" in out, out
    out, _ = bad.communicate(timeout=30)
    assert bad.returncode == 1 and "CUDA error 100: no CUDA-capable device" in out


def test_unreachable_pipe_dir_runs_without_mps_silently(sim: Sim) -> None:
    sim.start()
    missing = sim.client("--seconds", "0.3", pipe=sim.root / "elsewhere")
    out, _ = missing.communicate(timeout=30)
    assert missing.returncode == 0 and "mode=non-mps" in out and "error" not in out
    assert sim.out("get_server_list") == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
def test_other_user_without_permission_runs_without_mps(public_sim: Sim) -> None:
    sim = public_sim
    sim.start()
    os.chmod(sim.pipe, 0o700)  # the caller's choice: the daemon keeps it
    proc = subprocess.Popen(
        [str(sim.bin / "mps-sim-client"), "--seconds", "0.3"],
        env=sim.env(PATH="/usr/bin:/bin"),
        user=65534,
        group=65534,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd="/",
    )
    sim.procs.append(proc)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "mode=non-mps" in out, out
    assert sim.out("get_server_list") == ""


def test_stale_socket_after_quit_runs_without_mps(sim: Sim) -> None:
    sim.start()
    assert sim.ctl("quit").returncode == 0
    assert (sim.pipe / "control").exists()  # the real driver leaves its sockets behind
    client = sim.client("--seconds", "0.2")
    out, _ = client.communicate(timeout=30)
    assert client.returncode == 0 and "mode=non-mps" in out


def test_terminate_client_fails_it_with_810(sim: Sim) -> None:
    sim.start()
    client = sim.client("--seconds", "30", "--linger", "3")
    server = sim.server()
    assert sim.wait_clients(server, 1) == [client.pid]
    assert sim.out(f"terminate_client {server} {client.pid}") == "0"
    # Answered while the client, busy on the host, is still alive and still listed.
    assert client.poll() is None
    assert sim.out(f"get_client_list {server}") == str(client.pid)
    out, _ = client.communicate(timeout=30)
    assert client.returncode == 1
    assert "CUDA error 810: the MPS client has been terminated by the server" in out
    assert "Client termination succeeded." in sim.read_log("server.log")
    assert sim.out(f"get_server_status {server}") == "ACTIVE"
    assert sim.out(f"terminate_client {server} {client.pid}") != "0"
    assert sim.out(f"terminate_client 1 {client.pid}") == "Server 1 not found"


def test_a_command_sent_while_another_is_served_is_refused_busy(sim: Sim) -> None:
    sim.set_faults(terminate_reply=1.5)
    sim.start()
    client = sim.client("--seconds", "30")
    server = sim.server()
    sim.wait_clients(server, 1)
    # A control client already up and answering: its next command reaches the daemon at once,
    # well inside the terminate's 1.5 s, however slow a new process would be to start.
    asker = _asker(sim)
    command = f"terminate_client {server} {client.pid}"
    terminating = _quit_caller(sim, command)
    wait_until(lambda: f"Cmd:{command}" in sim.read_log("control.log"), 30, "the terminate")
    busy_out, busy_err = asker.communicate("get_server_list\n", timeout=30)
    assert asker.returncode == 1 and BUSY in busy_err, (busy_out, busy_err)
    out, _ = terminating.communicate(timeout=30)
    assert out.strip() == "0"
    assert sim.out("get_server_list") == str(server)  # served again once it has answered


def _asker(sim: Sim) -> subprocess.Popen[str]:
    """A control client reading commands from its stdin, once it has answered a first."""
    proc = _quit_caller(sim, "", stdin=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("get_server_list\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip(), "the control client did not answer"
    return proc


def test_shutdown_server_force_kills_its_clients_and_the_next_client_runs(sim: Sim) -> None:
    sim.start()
    clients = [sim.client("--seconds", "60") for _ in range(2)]
    server = sim.server()
    sim.wait_clients(server, 2)
    assert sim.out(f"shutdown_server {server} -f") == ""
    for c in clients:
        c.communicate(timeout=30)
        assert c.returncode == -signal.SIGPIPE  # exit 141 in a shell, as on an H100
    assert _gone(server) and sim.out("get_server_list") == ""
    assert "Client termination" not in sim.read_log("server.log")
    after = sim.client("--seconds", "0.5")
    out, _ = after.communicate(timeout=30)
    assert after.returncode == 0 and "mode=mps" in out, out
    assert sim.out("shutdown_server 1 -f") == "Server 1 not found"
    assert sim.out(f"shutdown_server {server} -x").startswith("Unknown command")


def test_server_has_no_arguments_and_inherits_env_uid_and_cpus(sim: Sim) -> None:
    cpus = sorted(os.sched_getaffinity(0))[:1]
    subprocess.run(
        ["taskset", "-c", ",".join(map(str, cpus)), sim.control, "-d"],
        env=sim.env(),
        check=True,
        timeout=15,
    )
    sim.start()  # already running: waits for it to answer
    sim.out(f"start_server -uid {os.getuid()}")
    server = psutil.Process(sim.server())
    assert str(sim.pipe) not in " ".join(server.cmdline())
    assert server.cmdline()[-2:] == ["-m", "mpswrap.sim.server"]
    assert server.environ()["CUDA_MPS_PIPE_DIRECTORY"] == str(sim.pipe)
    assert server.uids().real == os.getuid()
    assert server.cpu_affinity() == cpus


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_client_dies_by_signals_unless_they_are_ignored(sim: Sim, sig: int) -> None:
    with interruptible():
        plain = sim.client("--seconds", "30")
    assert "started" in (plain.stdout.readline() if plain.stdout else "")
    plain.send_signal(sig)
    plain.communicate(timeout=30)
    assert plain.returncode == -sig
    shielded = subprocess.Popen(
        ["/bin/sh", "-c", f'trap "" INT TERM; exec {sim.bin}/mps-sim-client --seconds 30'],
        env=sim.env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    sim.procs.append(shielded)
    assert "started" in (shielded.stdout.readline() if shielded.stdout else "")
    shielded.send_signal(sig)
    with pytest.raises(subprocess.TimeoutExpired):
        shielded.wait(0.5)


# --- quit --------------------------------------------------------------------------------
def _quit_caller(
    sim: Sim, line: str = "quit", stdin: int = subprocess.DEVNULL
) -> subprocess.Popen[str]:
    """The control client sending ``line`` (none: the lines of its ``stdin``)."""
    proc = subprocess.Popen(
        [sim.control, *line.split()],
        env=sim.env(),
        text=True,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    sim.procs.append(proc)
    return proc


def test_quit_blocks_while_a_client_lives_and_locks_the_daemon(sim: Sim) -> None:
    sim.start()
    record = sim.root / "record.jsonl"
    client = sim.client("--seconds", "120", "--record", str(record))  # killed below
    server = sim.server()
    sim.wait_clients(server, 1)
    quitter = _quit_caller(sim)
    waiting = "will not shutdown"
    wait_until(lambda: waiting in sim.read_log("control.log"), 30, "the quit to wait")
    with pytest.raises(subprocess.TimeoutExpired):
        quitter.wait(0.5)  # and it goes on waiting: the client has two minutes to run
    busy = sim.ctl(f"terminate_client {server} {client.pid}")
    assert busy.returncode == 1 and BUSY in busy.stderr
    assert client.poll() is None
    client.kill()
    client.communicate(timeout=30)
    assert quitter.wait(10) == 0  # once the client has gone
    # quit does not end clients, it waits for them: the kill alone ended this one.
    assert '"end"' not in record.read_text(), record.read_text()
    assert _gone(server) and not (sim.pipe / "nvidia-cuda-mps-control.pid").exists()


def test_a_lost_quit_leaves_the_daemon_working(sim: Sim) -> None:
    sim.start()
    client = sim.client("--seconds", "30")
    server = sim.server()
    sim.wait_clients(server, 1)
    with pytest.raises(subprocess.TimeoutExpired):
        sim.ctl("quit", timeout=1)  # run() kills the caller on its timeout
    deadline = time.monotonic() + 5
    while (res := sim.ctl("get_server_list")).returncode != 0:
        assert BUSY in res.stderr and time.monotonic() < deadline
        time.sleep(0.05)
    assert res.stdout.strip() == str(server)
    assert sim.out(f"terminate_client {server} {client.pid}") == "0"
    client.communicate(timeout=30)
    # The daemon has seen the client go (and checked the quit it lost right after, in the
    # same turn of its loop): a quit still pending would finish now.
    gone = f"Client process {client.pid} disconnected"
    wait_until(lambda: gone in sim.read_log("server.log"), 30, "the daemon to see the client go")
    assert sim.out("get_server_list") == str(server)  # the lost quit did not come back
    assert sim.ctl("quit").returncode == 0


def test_quit_with_timeout_forces_remaining_clients(sim: Sim) -> None:
    sim.start()
    clients = [sim.client("--seconds", "60") for _ in range(2)]
    server = sim.server()
    sim.wait_clients(server, 2)
    started = time.monotonic()
    res = sim.ctl("quit -t 1")
    assert res.returncode == 0 and 0.9 < time.monotonic() - started < 5
    for c in clients:
        out, _ = c.communicate(timeout=30)
        assert c.returncode == 1 and "CUDA error 806" in out, out
    assert f"Force shutting down server {server}" in sim.read_log("control.log")
    assert _gone(server)


def test_quit_answers_before_its_servers_exit(sim: Sim) -> None:
    sim.set_faults(quit_lag=1.5)  # ~80 ms on an H100; longer here to be seen
    sim.start()
    sim.out(f"start_server -uid {os.getuid()}")
    server, daemon = sim.server(), sim.daemon_pid()
    assert sim.ctl("quit").returncode == 0
    assert psutil.Process(server).is_running() and psutil.Process(daemon).is_running()
    res = sim.ctl("get_server_list")  # no longer listening
    assert res.returncode == 1 and NOT_RUNNING in res.stderr
    assert _gone(server) and _gone(daemon)


# --- limits and faults -------------------------------------------------------------------
def test_client_limit_from_the_fault_file(sim: Sim) -> None:
    sim.set_faults(client_limit=3)
    sim.start()
    record = sim.root / "r.jsonl"
    clients = [sim.client("--seconds", "20", "--record", str(record)) for _ in range(4)]
    server = sim.server()
    deadline = time.monotonic() + 30
    while sum(c.poll() is not None for c in clients) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    failed = next(c for c in clients if c.poll() is not None)
    out, _ = failed.communicate(timeout=30)
    assert failed.returncode == 1
    assert "CUDA error 46: CUDA-capable device(s) is/are busy or unavailable" in out
    assert len(sim.wait_clients(server, 3)) == 3
    assert sim.ctl("quit -t 1").returncode == 0
    ends = [json.loads(x) for x in record.read_text().splitlines() if '"end"' in x]
    assert sorted(e["reason"] for e in ends) == ["error46", "forced", "forced", "forced"]


def test_the_49th_client_fails_with_46(sim: Sim) -> None:
    sim.start()
    sim.out(f"start_server -uid {os.getuid()}")
    server = sim.server()
    clients = [sim.client("--seconds", "40") for _ in range(49)]
    deadline = time.monotonic() + 60
    while not (done := [c for c in clients if c.poll() is not None]):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert len(sim.wait_clients(server, 48, timeout=60)) == 48
    out, _ = done[0].communicate(timeout=30)
    assert done[0].returncode == 1 and "CUDA error 46" in out
    assert sim.ctl("quit -t 1").returncode == 0
    assert sum(c.wait(30) != 0 for c in clients) == 49


def test_fatal_fault_hits_every_client_then_the_server_recovers(sim: Sim) -> None:
    sim.start()
    bystander = sim.client("--seconds", "30")
    server = sim.server()
    sim.wait_clients(server, 1)
    culprit = sim.client("--seconds", "30", "--fault-after", "0.5")
    for proc in (culprit, bystander):
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 1 and "CUDA error 700: an illegal memory access" in out, out
    log = sim.read_log("server.log")
    assert f"Client {{PID: {culprit.pid}, Context: 1}} encountered a fatal GPU error." in log
    assert "Server is handling a fatal GPU error." in log
    sticky = log.split("The following client process have a sticky error set:")[1]
    assert str(bystander.pid) in sticky and str(culprit.pid) in sticky
    assert f"All clients belonging to error trigging process {bystander.pid} will be" in log
    assert sim.out(f"get_server_status {server}") == "ACTIVE"
    assert "Destroy server context on device 0" in sim.read_log("server.log")
    after = sim.client("--seconds", "0.2")
    out, _ = after.communicate(timeout=30)
    assert after.returncode == 0 and f"server={server}" in out


def test_server_stays_in_fault_while_an_affected_client_lives(sim: Sim) -> None:
    sim.start()
    frozen = sim.client("--seconds", "60")
    server = sim.server()
    sim.wait_clients(server, 1)
    frozen.send_signal(signal.SIGSTOP)  # cannot read its error, so it cannot exit
    culprit = sim.client("--seconds", "30", "--fault-after", "0.2")
    culprit.communicate(timeout=30)
    assert sim.out(f"get_server_status {server}") == "FAULT"
    refused = sim.client("--seconds", "1")
    out, _ = refused.communicate(timeout=30)
    assert refused.returncode == 1 and "CUDA error 807" in out
    frozen.kill()
    frozen.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while sim.out(f"get_server_status {server}") != "ACTIVE":
        assert time.monotonic() < deadline
        time.sleep(0.05)


# --- fault file --------------------------------------------------------------------------
def test_fault_start_fail_and_die(sim: Sim) -> None:
    sim.set_faults(start="fail")
    res = sim.start(wait=False)
    assert res.returncode == 1 and res.stderr
    assert not (sim.pipe / "nvidia-cuda-mps-control.pid").exists()
    sim.set_faults(start="die")
    assert sim.start(wait=False).returncode == 0
    deadline = time.monotonic() + 10
    while not (sim.pipe / "nvidia-cuda-mps-control.pid").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert _gone(sim.daemon_pid())  # a stale pid file, and nobody answers
    assert NOT_RUNNING in sim.ctl("get_server_list").stderr
    sim.set_faults()
    assert sim.start().returncode == 0  # the stale files do not block a new daemon


def test_fault_start_slow_returns_at_once_and_answers_later(sim: Sim) -> None:
    """``-d`` returns before the slow start is over (a Python start takes a second on a
    busy machine: the slow start is longer), and the daemon answers after it."""
    sim.set_faults(start="slow:4")
    started = time.monotonic()
    assert sim.start(wait=False).returncode == 0
    assert time.monotonic() - started < 4
    assert sim.ctl("get_server_list").returncode == 1
    sim.start()
    assert time.monotonic() - started >= 4


def test_fault_hang_blocks_the_caller_until_killed(sim: Sim) -> None:
    sim.start()
    sim.set_faults(hang=["get_server_list"])
    with pytest.raises(subprocess.TimeoutExpired):
        sim.ctl("get_server_list", timeout=1)
    assert sim.out("get_default_client_priority") == "0"
    sim.set_faults(hang=["*"])
    with pytest.raises(subprocess.TimeoutExpired):
        sim.ctl("get_default_client_priority", timeout=1)
    sim.set_faults()  # re-read at every command
    assert sim.out("get_server_list") == ""


def test_fault_die_on_leaves_stale_files_and_an_orphaned_server(sim: Sim) -> None:
    sim.start()
    sim.out(f"start_server -uid {os.getuid()}")
    server, daemon = sim.server(), sim.daemon_pid()
    sim.set_faults(die_on=["get_client_list"])
    res = sim.ctl(f"get_client_list {server}")
    assert res.returncode == 1 and NOT_RUNNING in res.stderr
    assert _gone(daemon)
    assert (sim.pipe / "nvidia-cuda-mps-control.pid").exists()
    assert (sim.pipe / "control").exists()
    assert psutil.Process(server).status() != psutil.STATUS_ZOMBIE  # orphaned, alive
    sim.set_faults()
    assert sim.start().returncode == 0
    assert sim.daemon_pid() != daemon
    os.kill(server, signal.SIGKILL)  # nobody else will: that is the point of the fault
    assert _gone(server)


def _delete_pipe_dir(sim: Sim) -> tuple[int, int]:
    sim.start()
    sim.out(f"start_server -uid {os.getuid()}")
    server, daemon = sim.server(), sim.daemon_pid()
    for path in sim.pipe.iterdir():
        path.unlink()
    sim.pipe.rmdir()
    return server, daemon


def test_daemon_and_server_outlive_their_deleted_pipe_dir(sim: Sim) -> None:
    server, daemon = _delete_pipe_dir(sim)
    # As the real ones: nothing answers any more, but both processes run on.
    assert not _gone(daemon, timeout=2.5) and not _gone(server, timeout=0.1)
    for pid in (server, daemon):
        os.kill(pid, signal.SIGKILL)
    assert _gone(daemon) and _gone(server)


def test_self_clean_ends_daemon_and_server_when_asked(sim: Sim) -> None:
    sim.set_faults(self_clean=True)
    server, daemon = _delete_pipe_dir(sim)
    assert _gone(daemon, timeout=5) and _gone(server, timeout=5)


# --- wrappers and inventory --------------------------------------------------------------
def test_install_bin_wrappers_work_from_a_bare_environment(tmp_path: Path) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpswrap.sim",
            "install-bin",
            str(tmp_path / "b"),
            "--faults",
            str(tmp_path / "f.json"),
        ],
        text=True,
        capture_output=True,
        check=True,
    )
    script = (tmp_path / "b" / "nvidia-cuda-mps-control").read_text()
    assert res.stdout.strip() == str(tmp_path / "b")
    assert script.startswith("#!/bin/sh\n") and f"exec {sys.executable} -m" in script
    assert f"MPSWRAP_SIM_FAULTS={tmp_path / 'f.json'}" in script
    assert os.access(tmp_path / "b" / "mps-sim-client", os.X_OK)
    client = subprocess.run(
        [
            "/usr/bin/env",
            "-i",
            f"CUDA_MPS_PIPE_DIRECTORY={tmp_path}/none",
            str(tmp_path / "b" / "mps-sim-client"),
            "--seconds",
            "0",
        ],
        text=True,
        capture_output=True,
        cwd="/",
        timeout=30,
    )
    assert client.returncode == 0 and "mode=non-mps" in client.stdout, client.stderr
    ctl = subprocess.run(
        [
            "/usr/bin/env",
            "-i",
            f"CUDA_MPS_PIPE_DIRECTORY={tmp_path}/none",
            str(tmp_path / "b" / "nvidia-cuda-mps-control"),
            "get_server_list",
        ],
        text=True,
        capture_output=True,
        cwd="/",
        timeout=30,
    )
    assert ctl.returncode == 1 and NOT_RUNNING in ctl.stderr


def test_fake_inventory_orders_minors_against_indices(tmp_path: Path) -> None:
    inv = fake_inventory(4, cpus=range(16))
    gpus = inv["gpus"]
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    assert [g["minor"] for g in gpus] == [3, 2, 1, 0]
    assert [g["cpus"] for g in gpus] == ["0-7", "8-15", "0-7", "8-15"]
    assert [g["numa_node"] for g in gpus] == [0, 1, 0, 1]
    assert len({g["uuid"] for g in gpus}) == 4 and fake_inventory(4, range(16)) == inv
    assert fake_inventory(2, cpus=[0])["gpus"][1]["cpus"] == "0"
    from mpswrap.mps.gpu import load_inventory

    path = write_inventory(tmp_path / "inv.json", 2)
    loaded = load_inventory(str(path))
    assert loaded.by_index(0).minor == 1 and loaded.driver_version == "580.159.04"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpswrap.sim",
            "inventory",
            str(tmp_path / "cli.json"),
            "--gpus",
            "3",
        ],
        check=True,
    )
    assert res.returncode == 0
    assert len(json.loads((tmp_path / "cli.json").read_text())["gpus"]) == 3
