"""Commands whose answer comes later: the daemon's loop completes them."""

from __future__ import annotations

from dataclasses import dataclass

from ._conn import Conn
from ._servers import Server


@dataclass
class Terminate:
    ui: Conn
    server: Server
    pid: int
    #: When the answer goes out (``terminate_reply`` after the command).
    deadline: float


@dataclass
class Quit:
    ui: Conn
    #: ``quit -t N``: when the remaining clients are forced out; None waits for ever.
    deadline: float | None
