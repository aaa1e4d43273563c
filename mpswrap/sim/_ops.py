"""Commands whose answer comes later: the daemon's loop completes them."""

from __future__ import annotations

from dataclasses import dataclass

from ._conn import Conn
from ._servers import Server

#: terminate_client answers once the client is gone, but never waits longer than this.
TERMINATE_WAIT = 5.0


@dataclass
class Terminate:
    ui: Conn
    server: Server
    pid: int
    deadline: float


@dataclass
class Quit:
    ui: Conn
    #: ``quit -t N``: when the remaining clients are forced out; None waits for ever.
    deadline: float | None
