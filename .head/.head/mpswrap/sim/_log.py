"""control.log and server.log in the real driver's line format.

``[2026-11-22 07:09:43.126 Control   457] Starting new server 457 for user 0``: the PID is
right-aligned in five columns as the 580 driver writes it. Every line is one O_APPEND write,
so lines of several writers never interleave.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def stamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


class MpsLog:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def control(self, pid: int, *lines: str) -> None:
        self._write("control.log", "Control", pid, lines)

    def server(self, pid: int, *lines: str) -> None:
        self._write("server.log", "Server", pid, lines)

    def touch(self) -> None:
        """Both files exist from the start, as with the real daemon."""
        for name in ("control.log", "server.log"):
            self._write(name, "", 0, ())

    def _write(self, name: str, who: str, pid: int, lines: tuple[str, ...]) -> None:
        text = "".join(f"[{stamp()} {who} {pid:5d}] {line}\n" for line in lines)
        try:
            fd = os.open(self.directory / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError:
            return  # a log that cannot be written must not take the daemon down
        try:
            if text:
                os.write(fd, text.encode())
        finally:
            os.close(fd)
