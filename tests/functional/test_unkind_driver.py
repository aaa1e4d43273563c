"""The teardown ladder where the driver is unkind, as the real one is (the simulator's defaults,
docs/concepts.md "The simulator against the real driver"): terminate_client answers before
the client has exited, a terminated client may take longer than the bound to go, the daemon
refuses a command while it serves another, and servers name their daemon only in their
environment."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading

import psutil
import pytest

from mpswrap.mps.control import Control
from mpswrap.paths import GpuDirs
from tests.simenv import SimNode

pytestmark = pytest.mark.functional
JOB = ["--job", "j1", "--node", "n1"]


@pytest.fixture
def node(one_gpu: SimNode) -> SimNode:
    return one_gpu  # one GPU is enough here


def _gpu(node: SimNode) -> GpuDirs:
    return node.layout("j1").gpu("g0")


def _start(node: SimNode) -> dict[str, object]:
    res = node.mpswrap("start", *JOB, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)[0]  # type: ignore[no-any-return]


def _client(
    node: SimNode, procs: list[subprocess.Popen[str]], uuid: object, *args: str
) -> subprocess.Popen[str]:
    dirs = _gpu(node)
    env = node.env(
        CUDA_MPS_PIPE_DIRECTORY=str(dirs.pipe),
        CUDA_MPS_LOG_DIRECTORY=str(dirs.log),
        CUDA_VISIBLE_DEVICES=str(uuid),
    )
    proc = subprocess.Popen(
        [node.client, "--seconds", "120", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    procs.append(proc)
    assert proc.stdout is not None
    assert "mode=mps" in proc.stdout.readline()
    return proc


def _control(node: SimNode) -> Control:
    dirs = _gpu(node)
    return Control(node.control, dirs.pipe, dirs.log, timeout=10)


def _wait_listed(control: Control, pids: set[int]) -> int:
    for _ in range(200):
        server = control.has_client(pids)
        if server is not None and pids <= set(control.clients()[server]):
            return server
        threading.Event().wait(0.05)
    raise AssertionError(f"{pids} never listed")


def test_a_terminated_client_that_outlives_the_bound_is_killed(
    node: SimNode, procs: list[subprocess.Popen[str]]
) -> None:
    manifest = _start(node)
    quick = _client(node, procs, manifest["gpu_uuid"])
    slow = _client(node, procs, manifest["gpu_uuid"], "--linger", "60")
    _wait_listed(_control(node), {quick.pid, slow.pid})
    res = node.mpswrap("stop", *JOB, MPSWRAP_TERMINATE_TIMEOUT="2")
    assert res.returncode == 0, res.stdout + res.stderr
    # Both were terminated (810); the one still busy on the host after the bound was killed.
    assert "g0: terminated 2 client(s), killed 1" in res.stdout, res.stdout
    slow.communicate(timeout=30)
    assert slow.returncode == -signal.SIGKILL
    out, _ = quick.communicate(timeout=30)
    assert quick.returncode == 1 and "CUDA error 810" in out, out
    assert not node.layout("j1").job_dir.exists() and not node.leftovers()


def test_a_command_the_daemon_is_too_busy_for_is_retried(
    node: SimNode, procs: list[subprocess.Popen[str]], caplog: pytest.LogCaptureFixture
) -> None:
    manifest = _start(node)
    node.faults.write_text(json.dumps({"terminate_reply": 1.0}))
    client = _client(node, procs, manifest["gpu_uuid"])
    control = _control(node)
    server = _wait_listed(control, {client.pid})
    busy = threading.Thread(target=control.terminate_client, args=(server, client.pid))
    busy.start()
    try:
        threading.Event().wait(0.3)  # the terminate_client is being served
        with caplog.at_level(logging.DEBUG, logger="mpswrap.mps.control"):
            assert control.server_list() == [server]
    finally:
        busy.join(timeout=30)
    assert "busy, retrying 'get_server_list'" in caplog.text
    control_log = _gpu(node).control_log.read_text()
    assert "Cannot send command to MPS control daemon process" in control_log
    client.communicate(timeout=30)
    assert node.mpswrap("stop", *JOB).returncode == 0


def test_a_server_known_only_by_its_environment_is_found_and_ended(
    node: SimNode, procs: list[subprocess.Popen[str]]
) -> None:
    """Started by the first client (after the manifest), orphaned by a daemon crash: its
    command line is bare, as a real server's, so only its environment ties it to the job."""
    manifest = _start(node)
    client = _client(node, procs, manifest["gpu_uuid"], "--seconds", "2")
    server = _wait_listed(_control(node), {client.pid})
    pipe = str(_gpu(node).pipe)
    assert pipe not in " ".join(psutil.Process(server).cmdline())
    assert psutil.Process(server).environ()["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    os.kill(int(str(manifest["daemon_pid"])), signal.SIGKILL)
    client.communicate(timeout=30)
    assert psutil.Process(server).is_running()
    res = node.mpswrap("stop", *JOB)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"forced daemon/server [{server}]" in res.stdout, res.stdout
    assert not psutil.pid_exists(server) or psutil.Process(server).status() == "zombie"
    assert not node.layout("j1").job_dir.exists() and not node.leftovers()


def test_past_the_terminate_window_the_server_is_shut_down_with_the_rest(
    node: SimNode, procs: list[subprocess.Popen[str]]
) -> None:
    """terminate_client takes 0.3 s each here (170 ms with 48 busy clients on an H100): after
    the 0.5 s window the job's server is shut down with the clients left, not one by one."""
    manifest = _start(node)
    node.faults.write_text(json.dumps({"terminate_reply": 0.3}))
    clients = [_client(node, procs, manifest["gpu_uuid"]) for _ in range(6)]
    server = _wait_listed(_control(node), {c.pid for c in clients})
    res = node.mpswrap("stop", *JOB, MPSWRAP_TERMINATE_WINDOW="0.5")
    assert res.returncode == 0, res.stdout + res.stderr
    head = res.stdout.splitlines()[1]
    assert f", shut down server {server} with " in head, res.stdout
    terminated = int(head.split("terminated ")[1].split()[0])
    dropped = int(head.split(" with ")[1].split()[0])
    assert 1 <= terminated <= 3 and terminated + dropped == 6, head
    codes = []
    for proc in clients:
        out, _ = proc.communicate(timeout=30)
        codes.append("810" if "CUDA error 810" in out else proc.returncode)
    assert codes.count("810") == terminated, codes
    assert codes.count(-signal.SIGPIPE) == dropped, codes  # the simulator's shut-down clients
    assert not node.layout("j1").job_dir.exists() and not node.leftovers()


def test_a_server_that_serves_others_too_is_never_shut_down(
    node: SimNode, procs: list[subprocess.Popen[str]]
) -> None:
    """A rank's ladder (``Daemon.end_clients`` for its own PIDs) past the window still ends
    its clients one by one: the server serves clients that are not being ended."""
    from mpswrap.config import load_settings
    from mpswrap.job.job import JobDaemons

    manifest = _start(node)
    node.faults.write_text(json.dumps({"terminate_reply": 0.3}))
    mine = [_client(node, procs, manifest["gpu_uuid"]) for _ in range(3)]
    other = _client(node, procs, manifest["gpu_uuid"])
    _wait_listed(_control(node), {c.pid for c in [*mine, other]})
    settings = load_settings(env=node.env(MPSWRAP_TERMINATE_WINDOW="0.1"))
    daemon = JobDaemons(node.layout("j1"), settings).daemon("g0")
    report = daemon.end_clients({c.pid for c in mine})
    assert sorted(report.terminated) == sorted(c.pid for c in mine) and not report.shut_down
    for proc in mine:
        out, _ = proc.communicate(timeout=30)
        assert "CUDA error 810" in out, out
    assert other.poll() is None  # still served
    assert node.mpswrap("stop", *JOB).returncode == 0
    other.communicate(timeout=30)
