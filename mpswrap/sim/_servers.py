"""MPS server processes: one ``python -m mpswrap.sim.server`` child of the daemon per user.

The server process does nothing but exist (so that a real server PID can be listed, signalled
and waited for); its state (clients, status, limits) lives in the daemon, which also writes
server.log under the server's PID. Like the real server it has no arguments: it inherits the
daemon's environment (``CUDA_MPS_PIPE_DIRECTORY`` among it), uid and CPU affinity, and only
the environment tells which daemon it belongs to.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
from dataclasses import dataclass, field

from ._common import BINARY_VERSION
from ._conn import Conn
from ._log import MpsLog


@dataclass
class Defaults:
    """Settings a server takes when it starts (lost when the daemon quits, as for real)."""

    active_thread_percentage: float = 100.0
    pinned_mem: dict[str, str] = field(default_factory=dict)
    client_priority: int = 0


@dataclass
class Server:
    uid: int
    proc: subprocess.Popen[bytes]
    active_thread_percentage: float
    pinned_mem: dict[str, str]
    status: str = "ACTIVE"
    #: ``shutdown_server`` without ``-f``: exits once its last client has gone.
    closing: bool = False
    clients: dict[int, Conn] = field(default_factory=dict)
    #: Clients that had the sticky error of the current fault and have not exited yet.
    sticky: set[int] = field(default_factory=set)
    #: Another busy client died while it handled a fault: it serves no client again (46).
    broken: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid


def pinned_bytes(value: str) -> int:
    """``2G`` -> 2 GiB, ``512M`` -> 512 MiB; ValueError otherwise."""
    units = {"G": 1 << 30, "M": 1 << 20}
    number, unit = value[:-1], value[-1:].upper()
    if unit not in units or not number.isdigit():
        raise ValueError(value)
    return int(number) * units[unit]


def spawn(uid: int, defaults: Defaults, log: MpsLog) -> Server:
    """Start a server and wait (bounded) until it says it is ready."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mpswrap.sim.server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        close_fds=True,  # above all the control_lock fd: an orphaned server must not hold it
    )
    server = Server(uid, proc, defaults.active_thread_percentage, dict(defaults.pinned_mem))
    log.control(proc.pid, f"Starting new server {proc.pid} for user {uid}")
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 10.0)
    if not ready or not proc.stdout.readline().startswith(b"ready"):
        stop(server, log, timeout=0.0)
        raise OSError(f"server {proc.pid} did not start")
    _started(server, defaults, log)
    return server


def _started(server: Server, defaults: Defaults, log: MpsLog) -> None:
    lines = [
        "Initializing server process",
        f"CUDA MPS Server for Linux/Unix. Binary version: {BINARY_VERSION}",
        f"Active Threads Percentage set to {server.active_thread_percentage:.1f}",
    ]
    for dev, value in sorted(server.pinned_mem.items()):
        lines.append(
            f"Device pinned memory limit for device {dev} set to {pinned_bytes(value):#x} bytes"
        )
    if defaults.client_priority:
        lines.append(f"Server Priority set to {defaults.client_priority}")
    log.server(server.pid, *lines, "Server has started")
    log.control(os.getpid(), f"NEW SERVER {server.pid}: Ready")


def stop(server: Server, log: MpsLog, timeout: float = 2.0) -> int:
    """Tell the server to exit, wait (bounded), kill if needed; return its exit status."""
    log.server(
        server.pid,
        "Server has been notified to shutdown",
        "Waiting for current clients to finish",
        "Exiting",
    )
    with contextlib.suppress(OSError):
        assert server.proc.stdin is not None
        server.proc.stdin.write(b"exit\n")
        server.proc.stdin.close()
    try:
        status = server.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        status = server.proc.wait()
    _close_pipes(server)
    log.control(os.getpid(), f"Server {server.pid} exited with status {status}")
    return status


def _close_pipes(server: Server) -> None:
    for pipe in (server.proc.stdin, server.proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def reap(server: Server, log: MpsLog) -> bool:
    """True (and logged) if the server process has exited on its own."""
    status = server.proc.poll()
    if status is None:
        return False
    _close_pipes(server)
    log.control(
        os.getpid(),
        "Server encountered a fatal exception. Shutting down",
        f"Server {server.pid} exited with status {status}",
    )
    return True
