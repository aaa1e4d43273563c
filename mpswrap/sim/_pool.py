"""The daemon's servers and their clients: attach, limits, faults, termination, shutdown.

A busy client (``--busy``: long kernels back to back) that dies without ``terminate_client``
(a signal) is a fatal error for its server, as seen on an H100 (driver 580): every other
client fails, and a second such death while the server handles the first (8 busy clients
SIGKILLed at once) leaves it unable to serve a new client (46) until it is restarted.
``terminate_client`` of a busy client while its server's first client (attached before any
other still there) is busy is one too, seen on the same driver (2026-11-28): the ended client
gets its 810, every other client fails, and the server serves no new client (46).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import _faults, _servers
from ._conn import Conn
from ._log import MpsLog
from ._servers import Defaults, Server


def visible(cvd: Any, gpu: str) -> bool:
    """Would a client with this CUDA_VISIBLE_DEVICES see the daemon's one GPU?

    Attached clients see only the daemon's devices, renumbered from 0: unset, ``0`` or the
    GPU's UUID (or a unique prefix) work, anything else finds no device (seen on an H100).
    CUDA stops at the first invalid entry, so only the first one counts.
    """
    if cvd is None:
        return True
    first = str(cvd).split(",")[0].strip()
    if first == "0":
        return True
    return first.upper().startswith("GPU-") and gpu.lower().startswith(first.lower())


class Pool:
    def __init__(self, pipe: Path, log: MpsLog, gpu: str, faults_path: str | None) -> None:
        self.pipe = pipe
        self.log = log
        self.gpu = gpu
        self.faults_path = faults_path
        self.uid = os.getuid()
        self.me = os.getpid()
        self.defaults = Defaults()
        #: One server per user, in start order.
        self.servers: dict[int, Server] = {}
        #: Clients of another user, queued until the current user's server is idle.
        self.waiting: list[Conn] = []

    # --- lookups -------------------------------------------------------------------------
    def by_pid(self, pid: int) -> Server | None:
        return next((s for s in self.servers.values() if s.pid == pid), None)

    def client_count(self) -> int:
        return sum(len(s.clients) for s in self.servers.values())

    def may_serve(self, uid: int) -> bool:
        # A daemon runs its servers as the user; only root can start one for someone else.
        return self.uid in (uid, 0)

    # --- servers -------------------------------------------------------------------------
    def start(self, uid: int) -> Server:
        """The user's server, started now if needed; idle servers of other users stop."""
        if uid in self.servers:
            return self.servers[uid]
        for other in [s for s in self.servers.values() if not s.clients]:
            self._stop(other)
        server = _servers.spawn(uid, self.defaults, self.log)
        self.servers[uid] = server
        return server

    def _stop(self, server: Server) -> None:
        self.servers.pop(server.uid, None)
        _servers.stop(server, self.log)
        for conn in server.clients.values():
            conn.close()

    def stop_all(self) -> None:
        for server in list(self.servers.values()):
            self._stop(server)
        for conn in self.waiting:
            _refuse(conn, 805)
        self.waiting.clear()

    def shutdown(self, server: Server, force: bool) -> None:
        """``shutdown_server``: now with ``force`` (clients killed), else once idle."""
        if force or not server.clients:
            for conn in server.clients.values():
                _doom(conn, "killed")
            self._stop(server)
            self._serve_waiting()
        else:
            server.closing = True

    def force(self) -> None:
        """``quit -t``: every remaining client gets error 806."""
        for server in self.servers.values():
            if server.clients:
                self.log.control(self.me, f"Force shutting down server {server.pid}")
            for conn in server.clients.values():
                _doom(conn, "forced")

    def tick(self) -> None:
        """Notice servers that died on their own (killed by someone): their clients fail."""
        for server in list(self.servers.values()):
            if _servers.reap(server, self.log):
                self.servers.pop(server.uid, None)
                for conn in server.clients.values():
                    _doom(conn, "forced")
                    conn.close()
        self._serve_waiting()

    # --- clients -------------------------------------------------------------------------
    def hello(self, conn: Conn, message: dict[str, Any], refusing: bool) -> None:
        conn.role = "client"
        if conn.pid <= 0 or conn.uid < 0:  # no kernel credentials: trust the client's word
            conn.pid, conn.uid = int(message.get("pid", 0)), int(message.get("uid", -1))
        conn.busy = message.get("busy") is True
        if refusing or not self.may_serve(conn.uid):
            _refuse(conn, 805)
        elif not visible(message.get("cvd"), self.gpu):
            _refuse(conn, 100)
        else:
            self._place(conn)

    def _place(self, conn: Conn) -> None:
        pid, uid = conn.pid, conn.uid
        if any(s.uid != uid and s.clients for s in self.servers.values()):
            # One user at a time per GPU: later users queue until the server is idle.
            self.log.control(
                self.me,
                f"NEW CLIENT {pid} from user {uid}: "
                "Server is busy with another user, push client to pending list",
            )
            self.waiting.append(conn)
            return
        if uid in self.servers:
            self.log.control(self.me, f"NEW CLIENT {pid} from user {uid}: Server already exists")
        else:
            self.log.control(
                self.me,
                f"NEW CLIENT {pid} from user {uid}: "
                "Server is not ready, push client to pending list",
            )
        try:
            server = self.start(uid)
        except OSError:
            _refuse(conn, 805)
            return
        self._admit(server, conn)

    def _admit(self, server: Server, conn: Conn) -> None:
        if server.broken:
            _refuse(conn, 46)  # what the next client saw on an H100 after 8 busy ones died
            return
        if server.status == "FAULT" or server.closing:
            # A server handling a fatal error takes no new clients (807 on an H100).
            _refuse(conn, 807)
            return
        if len(server.clients) >= _faults.load(self.faults_path).client_limit:
            _refuse(conn, 46)  # what the 49th client saw on an H100 (not 808)
            return
        server.clients[conn.pid] = conn
        conn.server_pid = server.pid
        ctx = f"{{PID: {conn.pid}, Context ID: 1}}"
        self.log.server(server.pid, f"Client {ctx} connected", f"Status of client {ctx} is ACTIVE")
        # The PID it is listed by (the kernel's, in the daemon's PID namespace): a client in a
        # container of its own knows itself by another.
        conn.send({"ok": True, "server": server.pid, "gpu": self.gpu, "pid": conn.pid})

    def gone(self, conn: Conn) -> None:
        """A client connection closed: the client process exited (or was killed)."""
        if conn in self.waiting:
            self.waiting.remove(conn)
            return
        server = self.by_pid(conn.server_pid)
        if server is None or server.clients.get(conn.pid) is not conn:
            return
        del server.clients[conn.pid]
        self.log.server(
            server.pid,
            f"Client {{PID: {conn.pid}, Context ID: 1}} exiting. "
            f"Number of active client contexts is {len(server.clients)}.",
            f"Client process {conn.pid} disconnected",
        )
        server.sticky.discard(conn.pid)
        if conn.busy:
            self._died_busy(server, conn.pid)
        if server.status == "FAULT" and not server.sticky and not server.broken:
            server.status = "ACTIVE"
            # An H100 logs no recovery line: the fault's end shows only as this, once the
            # last affected client has gone.
            self.log.server(server.pid, "Destroy server context on device 0")
        if server.closing and not server.clients:
            self._stop(server)
        self._serve_waiting()

    def _serve_waiting(self) -> None:
        if not self.waiting or any(s.clients for s in self.servers.values()):
            return
        queued, self.waiting = self.waiting, []
        for conn in queued:
            self._place(conn)

    def _died_busy(self, server: Server, pid: int) -> None:
        """A busy client died mid-kernel, its contexts never ended by the server: a fatal
        error for the others, or, while the server already handles one, the end of it."""
        if server.status == "FAULT":
            server.broken = True  # no line of its own in an H100's server.log
        else:
            self._fatal(server, pid)

    def fault(self, conn: Conn) -> None:
        """A client hit an illegal address: every client of that server gets the error."""
        server = self.by_pid(conn.server_pid)
        if server is not None and server.status != "FAULT":
            self._fatal(server, conn.pid)

    def _fatal(self, server: Server, culprit: int, spared: int | None = None) -> None:
        """A fatal GPU error met by ``culprit``: every client of the server gets it (but
        ``spared``, one the server has just ended)."""
        pids = sorted(p for p in server.clients if p != spared)
        # The lines of an H100 (driver 580): every client is called an "error trigging process".
        torn = [f"Client {{PID: {p}, Context ID: 1}} on device 0 to be torn down" for p in pids]
        for p in pids:
            torn += [
                f"All clients belonging to error trigging process {p} will be torn down",
                f"Client {{PID: {p}, Context ID: 1}} on the error-trigging process {p} "
                "to be torn down",
            ]
        self.log.server(
            server.pid,
            f"Client {{PID: {culprit}, Context: 1}} encountered a fatal GPU error.",
            "Server is handling a fatal GPU error.",
            *torn,
            "The following devices will be reset:",
            "0",
            "The following client process have a sticky error set:",
            *(str(p) for p in pids),
        )
        server.status = "FAULT"
        server.sticky = set(pids)
        for client in server.clients.values():
            if client.pid != spared:
                _doom(client, "fault")

    def terminate(self, server: Server, pid: int) -> bool:
        conn = server.clients.get(pid)
        if conn is None:
            self.log.server(
                server.pid,
                "Client termination request failed: There is no "
                f"active client context found for process {pid}.",
                "Client termination failed with invalid device context.",
            )
            return False
        first = next(iter(server.clients.values()))
        harms = conn.busy and first is not conn and first.busy and not first.doomed
        _doom(conn, "terminate")
        if harms:
            self._fatal(server, pid, spared=pid)
            server.broken = True
        return True


def _doom(conn: Conn, event: str) -> None:
    conn.doomed = True
    if event != "fault":  # the server ended its contexts (terminate_client, a forced end)
        conn.busy = False
    conn.send({"event": event})


def _refuse(conn: Conn, code: int) -> None:
    conn.send({"error": code})
    conn.close()
