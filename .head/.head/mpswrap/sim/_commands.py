"""The commands of ``nvidia-cuda-mps-control`` (protocol v2) and their exact replies.

Replies follow what the 580 driver printed on an H100 (docs/gpu-results): refusals such as
``Unknown command "x"`` and ``Server 1 not found`` go to stdout with exit status 0; only the
simulator's own guesses at unobserved errors use stderr and status 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import _faults
from ._ops import Quit, Terminate
from ._servers import Server, pinned_bytes

if TYPE_CHECKING:
    from ._conn import Conn
    from ._daemon import Daemon

#: (stdout, stderr, exit status), or None when the answer comes later (or never).
Result = tuple[str, str, int] | None
Handler = Callable[["Daemon", "Conn", list[str]], Result]


def _ok(stdout: str = "") -> Result:
    return stdout, "", 0


def _fail(stderr: str) -> Result:
    return "", stderr, 1


def _server(daemon: Daemon, arg: str) -> Server | None:
    return daemon.pool.by_pid(int(arg)) if arg.isdigit() else None


def _not_found(arg: str) -> Result:
    return _ok(f"Server {arg} not found")


def _percent(arg: str) -> float | None:
    try:
        value = float(arg)
    except ValueError:
        return None
    return value if 0 < value <= 100 else None


# --- queries -----------------------------------------------------------------------------
def get_server_list(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    return _ok("\n".join(str(s.pid) for s in daemon.pool.servers.values()))


def get_server_status(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    server = _server(daemon, args[0])
    return _ok(server.status) if server else _not_found(args[0])


def get_client_list(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    server = _server(daemon, args[0])
    return _ok("\n".join(map(str, server.clients))) if server else _not_found(args[0])


# --- servers and clients -----------------------------------------------------------------
def start_server(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    if args[0] != "-uid" or not args[1].isdigit():
        return _unknown("start_server " + " ".join(args))
    uid = int(args[1])
    if not daemon.pool.may_serve(uid):
        return _fail(f"Cannot start server for user {uid}: daemon runs as user {daemon.pool.uid}")
    try:
        daemon.pool.start(uid)
    except OSError as exc:
        return _fail(f"Failed to start server for user {uid}: {exc}")
    return _ok()


def terminate_client(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    server = _server(daemon, args[0])
    if server is None:
        return _not_found(args[0])
    pid = int(args[1]) if args[1].isdigit() else -1
    if not daemon.pool.terminate(server, pid):
        return _ok("201")  # cudaErrorInvalidContext: what the 580 driver printed
    reply = _faults.load(daemon.faults_path).terminate_reply
    daemon.terminations.append(Terminate(conn, server, pid, time.monotonic() + reply))
    return None


def shutdown_server(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    """``shutdown_server <pid> -f`` ends the server now: its clients die at their next CUDA
    call (SIGPIPE, or error 806, on an H100) and server.log has no termination lines. Without
    ``-f`` (not observed on a real driver) the server exits once its clients have gone."""
    if len(args) == 2 and args[1] != "-f":
        return _unknown("shutdown_server " + " ".join(args))
    server = _server(daemon, args[0])
    if server is None:
        return _not_found(args[0])
    daemon.pool.shutdown(server, force=len(args) == 2)
    return _ok()


def quit_daemon(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    deadline = None
    if args:
        if args[0] != "-t" or len(args) != 2 or not args[1].isdigit():
            return _unknown("quit " + " ".join(args))
        deadline = time.monotonic() + int(args[1])
    for server in daemon.pool.servers.values():
        daemon.log.control(daemon.me, f"Try shutting down server {server.pid}, backoff is disabled")
        if server.clients:
            daemon.log.control(
                daemon.me,
                f"Server {server.pid} has {len(server.clients)} active "
                "worker threads. Server will not shutdown.",
            )
    daemon.quitting = Quit(conn, deadline)
    daemon.tick()  # no clients: done at once
    return None


# --- settings ----------------------------------------------------------------------------
def set_default_active_thread_percentage(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    value = _percent(args[0])
    if value is None:
        return _fail(f"Invalid active thread percentage {args[0]}")
    daemon.pool.defaults.active_thread_percentage = value
    return _ok(f"{value:.1f}")


def get_default_active_thread_percentage(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    return _ok(f"{daemon.pool.defaults.active_thread_percentage:.1f}")


def set_active_thread_percentage(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    server, value = _server(daemon, args[0]), _percent(args[1])
    if server is None:
        return _not_found(args[0])
    if value is None:
        return _fail(f"Invalid active thread percentage {args[1]}")
    server.active_thread_percentage = value
    daemon.log.server(server.pid, f"Active Threads Percentage set to {value:.1f}")
    return _ok(f"{value:.1f}")


def get_active_thread_percentage(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    server = _server(daemon, args[0])
    return _ok(f"{server.active_thread_percentage:.1f}") if server else _not_found(args[0])


def _valid_limit(value: str) -> bool:
    try:
        pinned_bytes(value)
    except ValueError:
        return False
    return True


def set_default_device_pinned_mem_limit(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    if not _valid_limit(args[1]):
        return _fail(f"Invalid pinned memory limit {args[1]}")
    daemon.pool.defaults.pinned_mem[args[0]] = args[1]
    return _ok()


def get_default_device_pinned_mem_limit(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    return _ok(daemon.pool.defaults.pinned_mem.get(args[0], "0"))


def set_device_pinned_mem_limit(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    server = _server(daemon, args[0])
    if server is None:
        return _not_found(args[0])
    if not _valid_limit(args[2]):
        return _fail(f"Invalid pinned memory limit {args[2]}")
    server.pinned_mem[args[1]] = args[2]
    daemon.log.server(
        server.pid,
        f"Device pinned memory limit for device {args[1]} set to {pinned_bytes(args[2]):#x} bytes",
    )
    return _ok()


def get_device_pinned_mem_limit(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    server = _server(daemon, args[0])
    return _ok(server.pinned_mem.get(args[1], "0")) if server else _not_found(args[0])


def set_default_client_priority(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    if args[0] not in ("0", "1"):
        return _fail(f"Invalid client priority {args[0]}")
    daemon.pool.defaults.client_priority = int(args[0])
    return _ok()


def get_default_client_priority(daemon: Daemon, conn: Conn, args: list[str]) -> Result:
    return _ok(str(daemon.pool.defaults.client_priority))


#: name -> (handler, accepted argument counts)
COMMANDS: dict[str, tuple[Handler, tuple[int, ...]]] = {
    "get_server_list": (get_server_list, (0,)),
    "get_server_status": (get_server_status, (1,)),
    "get_client_list": (get_client_list, (1,)),
    "start_server": (start_server, (2,)),
    "terminate_client": (terminate_client, (2,)),
    "shutdown_server": (shutdown_server, (1, 2)),
    "quit": (quit_daemon, (0, 2)),
    "set_default_active_thread_percentage": (set_default_active_thread_percentage, (1,)),
    "get_default_active_thread_percentage": (get_default_active_thread_percentage, (0,)),
    "set_active_thread_percentage": (set_active_thread_percentage, (2,)),
    "get_active_thread_percentage": (get_active_thread_percentage, (1,)),
    "set_default_device_pinned_mem_limit": (set_default_device_pinned_mem_limit, (2,)),
    "get_default_device_pinned_mem_limit": (get_default_device_pinned_mem_limit, (1,)),
    "set_device_pinned_mem_limit": (set_device_pinned_mem_limit, (3,)),
    "get_device_pinned_mem_limit": (get_device_pinned_mem_limit, (2,)),
    "set_default_client_priority": (set_default_client_priority, (1,)),
    "get_default_client_priority": (get_default_client_priority, (0,)),
}


def _unknown(line: str) -> Result:
    return _ok(f'Unknown command "{line}"')


def run(daemon: Daemon, conn: Conn, line: str) -> Result:
    words = line.split()
    entry = COMMANDS.get(words[0]) if words else None
    if entry is None or len(words) - 1 not in entry[1]:
        return _unknown(line)
    return entry[0](daemon, conn, words[1:])
