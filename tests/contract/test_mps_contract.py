"""MPS behaviours mpswrap relies on, identical for the simulator and the real driver.

Each test pins one row of the table "The simulator against the real driver" in
docs/concepts.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Any

import psutil
import pytest

from mpswrap.errors import ControlError
from mpswrap.mps.gpu import usage
from mpswrap.mps.mpslog import read_faults, server_pids
from mpswrap.sim.inventory import MEMORY_TOTAL
from mpswrap.taskfarm.admission import FULL_FRACTION, OOM_TEXT
from tests.waits import wait_until

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

    # The real driver says INITIALIZING for a moment after start_server (two H200s, driver
    # 580.159.04, 2026-11-28); the simulator's server is ACTIVE at once.
    def settled() -> str | None:
        found = ctl.server_status(server)
        return None if found == "INITIALIZING" else found

    assert wait_until(settled, 30, "the server to leave INITIALIZING") == "ACTIVE"
    assert ctl.active_thread_percentage(server) == 25.0


def test_commands_on_one_stdin_are_answered_in_order(backend: Backend) -> None:
    """``status`` sends several queries on one stdin (``Control.snapshot``): each one-line
    reply comes in order, the list of clients last."""
    backend.start_daemon()
    ctl = backend.control()
    clients = [backend.client("--seconds", "6") for _ in range(2)]
    server = backend.server()
    backend.wait_clients(server, 2)
    found = ctl.snapshot()
    assert found.default_active_thread_percentage == 100.0
    assert list(found.servers) == [server]
    state, share, listed = found.servers[server]
    assert (state, share) == ("ACTIVE", 100.0)
    assert sorted(listed) == sorted(c.pid for c in clients)
    for c in clients:
        out, _ = c.communicate(timeout=60)
        assert c.returncode == 0, out


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
    # --linger: after its CUDA call fails, the client stays on the host for 3 s.
    client = backend.client("--seconds", "30", "--linger", "3")
    # Past initialisation: terminated while still in cudaMalloc, a real client sees error 46
    # (seen on driver 580), not 810.
    backend.started(client)
    server = backend.server()
    assert backend.wait_clients(server, 1) == [client.pid]
    backend.control().terminate_client(server, client.pid)
    # Answered before the client has exited: ending clients means waiting for them after.
    assert client.poll() is None
    assert backend.control().client_list(server) == [client.pid]
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
    assert "CUDA error 806" in out, out
    # quit returns before its server has exited; it does exit, within a bounded time.
    assert _gone(server, timeout=10)


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
    failed = [out for (out, _), c in zip(outs, clients, strict=False) if c.returncode != 0]
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
    # The block mpswrap's status reads: one fault, every client of the server named in it.
    faults = read_faults(backend.log / "server.log")
    assert len(faults) == 1, backend.server_log()
    named = set(faults[0].reported_by) | set(faults[0].affected)
    assert {culprit.pid, bystander.pid} <= named, backend.server_log()
    for line in (
        "encountered a fatal GPU error.",
        "Server is handling a fatal GPU error.",
        "The following client process have a sticky error set:",
    ):
        assert line in backend.server_log(), line
    wait_until(backend.recovered, 30, "the server to recover")
    after = backend.client("--seconds", "1")
    out, _ = after.communicate(timeout=60)
    assert after.returncode == 0, out


def test_new_clients_are_refused_while_the_server_is_in_fault(backend: Backend) -> None:
    backend.start_daemon()
    bystander = backend.client("--seconds", "30", "--linger", "8")
    server = backend.server()
    backend.wait_clients(server, 1)
    culprit = backend.client("--seconds", "30", "--fault-after", "1", "--linger", "8")
    wait_until(lambda: backend.control().server_status(server) == "FAULT", 30, "FAULT status")
    late = backend.client("--seconds", "1")
    out, _ = late.communicate(timeout=60)
    assert late.returncode != 0 and "CUDA error 807" in out, out
    for proc in (culprit, bystander):
        proc.communicate(timeout=60)


def test_a_command_sent_while_quit_waits_is_refused_busy(backend: Backend) -> None:
    backend.start_daemon()
    client = backend.client("--seconds", "120")  # ended below, once the answer is in
    server = backend.server()
    backend.wait_clients(server, 1)
    command = backend.root / "quit.txt"
    command.write_text("quit\n")
    with command.open() as stdin:
        quitter = subprocess.Popen(
            [backend.control_binary],
            env=backend.env(),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    backend.procs.append(quitter)
    wait_until(lambda: "Cmd:quit" in _control_log(backend), 30, "the daemon to log the quit")
    busy = subprocess.run(
        [backend.control_binary],
        input="get_server_list\n",
        env=backend.env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "Cannot send command to MPS control daemon process" in busy.stdout + busy.stderr
    client.kill()
    client.communicate(timeout=60)
    quitter.wait(timeout=30)  # the quit goes through once the client is gone


def test_control_log_names_each_server_it_starts(backend: Backend) -> None:
    backend.start_daemon()
    backend.control().start_server(os.getuid())
    server = backend.server()
    assert server_pids(backend.log / "control.log") == {server}
    assert (
        f"Starting new server {server} for user {os.getuid()}"
        in (backend.log / "control.log").read_text()
    )


def test_server_has_no_arguments_and_the_daemon_environment_uid_and_cpus(
    backend: Backend,
) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    cpus = cpus[2:4] if len(cpus) >= 4 else cpus[:1]
    backend.start_daemon(cpus=cpus)
    backend.control().start_server(os.getuid())
    server = _process(backend.server())
    # Only the environment ties a server to its daemon: mpswrap finds servers by it.
    assert str(backend.root) not in " ".join(server.cmdline()), server.cmdline()
    assert server.environ()["CUDA_MPS_PIPE_DIRECTORY"] == str(backend.pipe)
    assert server.uids().real == os.getuid()
    assert sorted(server.cpu_affinity()) == cpus


def test_two_daemons_on_one_gpu_serve_their_clients_at_once(backend: Backend) -> None:
    other_pipe, other_log = backend.root / "pipe2", backend.root / "log2"
    backend.start_daemon()
    backend.start_daemon(pipe=other_pipe, log=other_log)
    first = backend.client("--seconds", "8")
    second = backend.client("--seconds", "8", pipe=other_pipe, log=other_log)
    assert backend.wait_clients(backend.server(), 1) == [first.pid]
    other = backend.server(pipe=other_pipe)
    assert backend.wait_clients(other, 1, pipe=other_pipe) == [second.pid]
    for proc in (first, second):
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out


def test_a_client_seeing_device_1_finds_no_device(backend: Backend) -> None:
    backend.start_daemon()
    client = backend.client("--seconds", "1", CUDA_VISIBLE_DEVICES="1")
    out, _ = client.communicate(timeout=60)
    assert client.returncode != 0
    assert "CUDA error 100" in out, out


def test_shutdown_server_force_ends_its_clients_and_the_next_client_runs(
    backend: Backend,
) -> None:
    backend.start_daemon()
    clients = [backend.client("--seconds", "60") for _ in range(2)]
    for proc in clients:
        backend.started(proc)  # past cudaMalloc: ended while still in it, a client sees 46
    server = backend.server()
    backend.wait_clients(server, 2)
    backend.control().command(f"shutdown_server {server} -f")
    for proc in clients:
        out, _ = proc.communicate(timeout=30)
        # Its next CUDA call writes to the gone server (SIGPIPE) or fails with 806: both seen
        # on an H100, from one run to the next.
        ended = proc.returncode == -signal.SIGPIPE or "CUDA error 806" in out
        assert proc.returncode != 0 and ended, (proc.returncode, out)
    assert _gone(server, timeout=10)
    assert server not in backend.control().server_list()
    after = backend.client("--seconds", "1")
    out, _ = after.communicate(timeout=60)
    assert after.returncode == 0, out


def _control_log(backend: Backend) -> str:
    path = backend.log / "control.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _process(pid: int) -> psutil.Process:
    return psutil.Process(pid)


def _gone(pid: int, timeout: float) -> bool:
    """Exited (a zombie counts: its parent, the daemon, reaps it when it gets to it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _gpu_memory(backend: Backend) -> tuple[str, dict[str, Any]]:
    """NVML's source for the backend's GPU, and what its clients need to share that memory:
    the real GPU through NVML; the simulator's through an inventory naming it."""
    if backend.name == "real":
        return "nvml", {}
    inventory = backend.root / "gpus.json"
    gpu = {"index": 0, "uuid": backend.gpu, "minor": 0, "compute_capability": [9, 0]}
    inventory.write_text(json.dumps({"gpus": [{**gpu, "memory_total": MEMORY_TOTAL}]}))
    return str(inventory), {"MPSWRAP_GPU_INVENTORY": str(inventory)}


def test_a_client_that_asks_for_more_than_is_free_gets_cuda_out_of_memory(
    backend: Backend,
) -> None:
    """What the farm's out-of-memory verdict relies on (``job.gpumemory``): CUDA's text, and
    NVML showing the GPU nearly full, with the client that fills it and its memory listed."""
    source, extra = _gpu_memory(backend)
    backend.start_daemon()
    total = usage(backend.gpu, source)
    assert total is not None and total["memory_total_bytes"], total
    total_mib = total["memory_total_bytes"] >> 20
    hog = backend.client("--seconds", "60", "--alloc-mib", str(int(total_mib * 0.92)), **extra)
    backend.started(hog)
    seen = usage(backend.gpu, source)
    assert seen is not None
    free = seen["memory_total_bytes"] - seen["memory_used_bytes"]
    print(f"NVML with the hog: {seen}; free {free >> 20} MiB of {total_mib} MiB")
    assert free < FULL_FRACTION * seen["memory_total_bytes"]
    assert seen["processes"].get(hog.pid, 0) >= int(total_mib * 0.92) << 20
    late = backend.client("--seconds", "1", "--alloc-mib", str(int(total_mib * 0.3)), **extra)
    out, _ = late.communicate(timeout=60)
    print(f"the client that crossed said: {out!r}")
    assert late.returncode == 1
    assert OOM_TEXT.search(out), out
    assert "CUDA error 2: out of memory" in out
