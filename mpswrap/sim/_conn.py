"""One accepted connection to the daemon: a command caller ("ui") or a CUDA client."""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
from collections.abc import Mapping
from typing import Any

from ._common import LineBuffer, encode


def _peer(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the peer from the kernel, as the real daemon checks credentials."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (AttributeError, OSError):
        return 0, -1
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


class Conn:
    def __init__(self, sock: socket.socket, selector: selectors.BaseSelector) -> None:
        self.sock = sock
        self.selector = selector
        self._fd = sock.fileno()
        self.buffer = LineBuffer()
        self.role = ""
        self.pid, self.uid = _peer(sock)
        self.server_pid = 0
        self.closed = False
        #: Set once a terminate/fault/force message went out: the client is on its way out.
        self.doomed = False
        #: A client of long kernels back to back (``--busy``) that has not said its work
        #: stopped and whose contexts the server has not ended: its connection closing now
        #: is a death mid-kernel (``Pool.gone``).
        self.busy = False

    def fileno(self) -> int:
        # Kept from the start: the selector must find this entry even after the close.
        return self._fd

    def send(self, message: Mapping[str, Any]) -> None:
        if self.closed:
            return
        try:
            self.sock.sendall(encode(message))
        except OSError:
            pass  # the peer is gone; its EOF is handled by the event loop

    def reply(self, stdout: str = "", stderr: str = "", rc: int = 0) -> None:
        """Answer a command caller; the connection closes after the answer."""
        self.send({"stdout": stdout, "stderr": stderr, "rc": rc})
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            # Unregister before closing, so a new connection reusing the fd number can register.
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(self)
            with contextlib.suppress(OSError):
                self.sock.close()
