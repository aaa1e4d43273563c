"""MPS behaviours mpswrap relies on, identical for the simulator and the real driver."""

from __future__ import annotations

import subprocess
import time

import pytest

from mpswrap.errors import ControlError

from .conftest import Backend

pytestmark = pytest.mark.contract


def test_start_answers_and_second_start_is_refused(backend: Backend) -> None:
    backend.start_daemon()
    assert backend.control().server_list() == []
    again = subprocess.run(
        [backend.control_binary, "-d"],
        env=backend.env(),
        text=True,
        capture_output=True,
        timeout=30,
    )
    assert again.returncode != 0
    assert "already running" in again.stdout + again.stderr
    assert (backend.pipe / "nvidia-cuda-mps-control.pid").exists()


def test_no_daemon_is_an_error(backend: Backend) -> None:
    with pytest.raises(ControlError, match="Cannot find MPS control daemon"):
        backend.control().server_list()


def test_unknown_command_and_unknown_server_are_refused(backend: Backend) -> None:
    backend.start_daemon()
    with pytest.raises(ControlError, match="Unknown command"):
        backend.control().command("no_such_command")
    with pytest.raises(ControlError, match="not found"):
        backend.control().client_list(1)


def test_defaults_round_trip(backend: Backend) -> None:
    backend.start_daemon()
    ctl = backend.control()
    assert ctl.default_active_thread_percentage() == 100.0
    assert ctl.set_default_active_thread_percentage(25) == 25.0
    ctl.set_default_pinned_mem_limit("0", "2G")
    assert ctl.command("get_default_device_pinned_mem_limit 0") == "2G"
    ctl.set_default_client_priority(1)
    assert ctl.command("get_default_client_priority") == "1"
    ctl.start_server(int(subprocess.run(["id", "-u"], capture_output=True, text=True).stdout))
    server = backend.server()
    assert ctl.server_status(server) == "ACTIVE"
    assert ctl.active_thread_percentage(server) == 25.0


def test_clients_attach_and_are_listed(backend: Backend) -> None:
    backend.start_daemon()
    clients = [backend.client("--seconds", "6") for _ in range(2)]
    server = backend.server()
    listed = backend.wait_clients(server, 2)
    assert sorted(listed) == sorted(c.pid for c in clients)
    for c in clients:
        out, _ = c.communicate(timeout=60)
        assert c.returncode == 0, out


def test_terminate_client_ends_a_busy_client(backend: Backend) -> None:
    backend.start_daemon()
    client = backend.client("--seconds", "30")
    # Past initialisation: terminated while still in cudaMalloc, a real client sees error 46
    # (seen on driver 580), not 810.
    assert client.stdout is not None
    assert "started" in client.stdout.readline()
    server = backend.server()
    assert backend.wait_clients(server, 1) == [client.pid]
    backend.control().terminate_client(server, client.pid)
    out, _ = client.communicate(timeout=30)
    assert client.returncode != 0
    assert "810" in out, out
    assert "Client termination succeeded" in backend.server_log()
    assert backend.control().server_status(server) == "ACTIVE"


def test_terminate_client_of_a_non_client_is_refused(backend: Backend) -> None:
    backend.start_daemon()
    backend.control().start_server(
        int(subprocess.run(["id", "-u"], capture_output=True, text=True).stdout)
    )
    server = backend.server()
    with pytest.raises(ControlError):
        backend.control().terminate_client(server, 1)


def test_quit_blocks_while_a_client_lives(backend: Backend) -> None:
    backend.start_daemon()
    client = backend.client("--seconds", "8")
    server = backend.server()
    assert backend.wait_clients(server, 1) == [client.pid]
    with pytest.raises(ControlError, match="timed out"):
        backend.control(timeout=1.5).quit()
    client.communicate(timeout=60)
    assert client.returncode == 0
    # The caller that sent quit was killed. The driver may still finish that quit once the
    # client is gone (seen on 580) or lose it (seen earlier): either way a second quit, if the
    # daemon still answers, ends it, and mpswrap's ladder kills by PID after a bounded quit.
    deadline = time.monotonic() + 10
    while (backend.pipe / "nvidia-cuda-mps-control.pid").exists():
        try:
            backend.control().quit()
        except ControlError as exc:
            if "Cannot find MPS control daemon" not in str(exc):
                raise
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_quit_with_timeout_forces_a_busy_client(backend: Backend) -> None:
    backend.start_daemon()
    client = backend.client("--seconds", "60")
    server = backend.server()
    assert backend.wait_clients(server, 1) == [client.pid]
    started = time.monotonic()
    backend.control().quit(force_after=2)
    assert time.monotonic() - started < 10
    out, _ = client.communicate(timeout=30)
    assert client.returncode != 0, out


def test_unreachable_pipe_dir_falls_back_silently(backend: Backend) -> None:
    backend.start_daemon()
    client = backend.client("--seconds", "1", pipe=backend.root / "elsewhere")
    out, _ = client.communicate(timeout=60)
    assert client.returncode == 0, out
    assert backend.control().server_list() == []


def test_client_limit_refuses_the_49th(backend: Backend) -> None:
    backend.start_daemon()
    clients = [backend.client("--seconds", "25") for _ in range(49)]
    server = backend.server()
    listed = backend.wait_clients(server, 48, timeout=90)
    assert len(listed) == 48
    outs = [c.communicate(timeout=120) for c in clients]
    failed = [out for (out, _), c in zip(outs, clients) if c.returncode != 0]
    assert len(failed) == 1, failed
    assert "CUDA error 46" in failed[0]


def test_fatal_fault_hits_every_client_then_server_recovers(backend: Backend) -> None:
    backend.start_daemon()
    bystander = backend.client("--seconds", "20")
    server = backend.server()
    backend.wait_clients(server, 1)
    culprit = backend.client("--seconds", "20", "--fault-after", "1")
    outs = [p.communicate(timeout=60)[0] for p in (culprit, bystander)]
    assert culprit.returncode != 0 and bystander.returncode != 0
    assert all("CUDA error 700" in o for o in outs), outs
    assert "fatal GPU error" in backend.server_log()
    deadline = time.monotonic() + 30
    while True:
        # Recovered: the server is ACTIVE again (or gone, to be restarted by the next client).
        servers = backend.control().server_list()
        if not servers or backend.control().server_status(servers[0]) == "ACTIVE":
            break
        assert time.monotonic() < deadline, "server did not recover"
        time.sleep(0.2)
    after = backend.client("--seconds", "1")
    out, _ = after.communicate(timeout=60)
    assert after.returncode == 0, out
