"""The control daemon's event loop: one thread, one selector, timers checked every 0.1 s.

Commands that take time (``terminate_client``, ``quit``) become pending operations that the
loop completes later. The daemon keeps serving CUDA clients meanwhile, but, like the real one,
serves one command at a time: any other command sent while one is pending is refused with
"Cannot send command to MPS control daemon process".
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import sys
import time
from pathlib import Path
from typing import Any

from . import _commands, _faults
from ._common import BINARY_VERSION, BUSY, CONTROL, PID_FILE, PRIVILEGED
from ._conn import Conn
from ._log import MpsLog
from ._ops import Quit, Terminate
from ._pool import Pool

#: With ``self_clean`` (off unless a test asks), how often the daemon checks that its pipe
#: directory still exists.
DIR_POLL = 1.0


class Daemon:
    def __init__(self, pipe: Path, log_dir: Path, gpu: str, faults_path: str | None) -> None:
        self.pipe = pipe
        self.log = MpsLog(log_dir)
        self.faults_path = faults_path
        self.me = os.getpid()
        self.pool = Pool(pipe, self.log, gpu, faults_path)
        self.selector = selectors.DefaultSelector()
        self.terminations: list[Terminate] = []
        self.quitting: Quit | None = None
        #: quit has answered: the servers stop, and the daemon exits, at this time.
        self.exit_at: float | None = None
        self.exit_code: int | None = None
        self._dir_id = _dir_id(pipe)
        self._next_dir_check = time.monotonic() + DIR_POLL

    # --- set-up --------------------------------------------------------------------------
    def listen(self) -> None:
        for name, mode in ((CONTROL, 0o666), (PRIVILEGED, 0o755)):
            path = self.pipe / name
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # stale from a crashed daemon: we hold control_lock
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(path))
            os.chmod(path, mode)  # anyone who can enter the pipe directory may connect
            sock.listen(128)
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ, None)
        self.log.control(
            self.me,
            f"Starting control daemon using socket {self.pipe / CONTROL}",
            "To connect CUDA applications to this daemon, set env "
            f"CUDA_MPS_PIPE_DIRECTORY={self.pipe}",
            f"CUDA MPS Control binary version: {BINARY_VERSION}",
        )

    def run(self) -> int:
        while self.exit_code is None:
            for key, _ in self.selector.select(timeout=0.1):
                if key.data is None:
                    self._accept(key.fileobj)
                else:
                    self._read(key.data)
            self.tick()
        self.selector.close()
        return self.exit_code

    # --- events --------------------------------------------------------------------------
    def _accept(self, listener: Any) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(False)
            conn = Conn(sock, self.selector)
            self.selector.register(conn, selectors.EVENT_READ, conn)

    def _read(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        for message in conn.buffer.feed(data):
            if not conn.closed:
                self._message(conn, message)
        if not data:
            conn.close()
            if conn.role == "client":
                self.pool.gone(conn)

    def _message(self, conn: Conn, message: dict[str, Any]) -> None:
        if conn.role == "" and message.get("role") == "ui":
            conn.role = "ui"
            self._command(conn, str(message.get("cmd", "")).strip())
        elif conn.role == "" and message.get("role") == "client":
            refusing = self.quitting is not None or self.exit_at is not None
            self.pool.hello(conn, message, refusing=refusing)
        elif conn.role == "client" and message.get("event") == "fault":
            self.pool.fault(conn)
        elif conn.role == "client" and message.get("event") == "idle":
            conn.busy = False

    def _command(self, conn: Conn, line: str) -> None:
        name = (line.split() or [""])[0]
        self.log.control(self.me, "NEW UI", f"Cmd:{line}")
        faults = _faults.load(self.faults_path)
        if faults.dies_on(name):
            os._exit(1)  # a crash: no cleanup, pid file and socket stay, servers are orphaned
        if faults.becomes_on(name):
            # What a job user who may ptrace their own daemon can make of it: the same process
            # (PID, start time, servers as children) running another program, environment
            # cleared, that restarts a child whenever it ends. Only root's record and cgroup
            # still say it is the daemon.
            respawn = "import subprocess\nwhile True:\n    subprocess.run(['/bin/sleep', '300'])"
            os.execve(sys.executable, [sys.executable, "-c", respawn], {})  # noqa: S606
        if faults.hangs(name):
            return  # never answered; the connection stays until the caller gives up
        if self.quitting is not None or self.terminations:
            # One command at a time: while a quit waits for clients, or a terminate_client is
            # being served, the real daemon refuses every other command.
            self.answer(conn, "", BUSY, 1)
            return
        result = _commands.run(self, conn, line)
        if result is not None:
            self.answer(conn, *result)

    def answer(self, conn: Conn, stdout: str = "", stderr: str = "", rc: int = 0) -> None:
        lines = [ln for ln in (stdout + "\n" + stderr).splitlines() if ln]
        self.log.control(self.me, *lines, "UI closed")
        conn.reply(stdout, stderr, rc)

    # --- timers --------------------------------------------------------------------------
    def tick(self) -> None:
        now = time.monotonic()
        self.pool.tick()
        for op in list(self.terminations):
            # Answered once the server has ended the client's contexts, whether or not the
            # client process has exited yet.
            if now >= op.deadline:
                self.terminations.remove(op)
                self.log.server(op.server.pid, "Client termination succeeded.")
                self.answer(op.ui, "0")
        if self.quitting is not None:
            self._poll_quit(self.quitting, now)
        if self.exit_at is not None and now >= self.exit_at:
            self.pool.stop_all()
            self.log.control(self.me, "Exit with status 0")
            self.exit_code = 0
        if now >= self._next_dir_check:
            self._next_dir_check = now + DIR_POLL
            clean = _faults.load(self.faults_path).self_clean
            if clean and _dir_gone(self.pipe, self._dir_id):
                self.log.control(self.me, "Pipe directory removed: exiting (simulator)")
                self.pool.stop_all()
                self.exit_code = 0

    def _poll_quit(self, op: Quit, now: float) -> None:
        if op.ui.closed:
            # The caller was killed before the clients left: the quit is lost (seen on 580).
            self.log.control(self.me, "UI closed")
            self.quitting = None
        elif self.pool.client_count() == 0:
            self._finish_quit(op)
        elif op.deadline is not None and now >= op.deadline:
            self.pool.force()
            self._finish_quit(op)

    def _finish_quit(self, op: Quit) -> None:
        """Answer the quit, stop listening; servers and daemon exit quit_lag later, as the
        real ones exit after quit has returned."""
        self.quitting = None
        with contextlib.suppress(OSError):
            (self.pipe / PID_FILE).unlink()
        # The real driver leaves the control sockets and control_lock behind after quit.
        for key in list(self.selector.get_map().values()):
            if key.data is None:
                self.selector.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
        op.ui.reply()
        self.exit_at = time.monotonic() + _faults.load(self.faults_path).quit_lag


def _dir_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _dir_gone(path: Path, ident: tuple[int, int] | None) -> bool:
    """Deleted, or deleted and made again (unreadable is not gone)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return ident is not None and (st.st_dev, st.st_ino) != ident
