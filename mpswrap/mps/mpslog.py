"""Reading the MPS control.log and server.log: fatal faults and client terminations.

Line format: ``[2026-11-22 06:53:48.123 Server 4242] <text>``; only the text is interpreted.
The logs lie in a directory the job's user owns: they are read through ``read_job_file``
(a regular file, never blocking), their last ``LOG_LIMIT`` bytes at most.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

from .._struct import Struct, field
from ..paths import read_job_file

__all__ = ["LOG_LIMIT", "Fault", "read_faults", "server_pids", "terminations"]

#: How much of a log is read (its end): a job's logs are a few KiB; a planted one may be huge.
LOG_LIMIT = 8 << 20

_LINE = re.compile(r"^\[(?P<stamp>[^\]]*?)\s+(?P<who>\w+)\s+(?P<pid>\d+)\]\s?(?P<text>.*)$")
_FATAL_CLIENT = re.compile(r"Client \{PID: (\d+), Context(?: ID)?: \d+\} encountered a fatal")
_PID_ONLY = re.compile(r"^\s*(\d+)\s*$")
_NEW_SERVER = re.compile(r"Starting new server (\d+)")
_NEW_CLIENT = re.compile(r"NEW CLIENT (\d+) from user")


class Fault(Struct):
    """One fatal GPU error handled by a server.

    ``reported_by`` are the clients the server names in "Client {PID: …} encountered a fatal
    GPU error": the ones that met the error first, not necessarily the one that caused it (on
    Volta and later MPS does not say which client caused a fault; on the H100 it named a
    bystander). ``affected`` are the clients left with the sticky error.
    """

    time: str
    server_pid: int
    reported_by: list[int] = field(default_factory=list)
    affected: list[int] = field(default_factory=list)
    recovered: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "time": self.time,
            "server_pid": self.server_pid,
            "reported_by": self.reported_by,
            "affected": self.affected,
            "recovered": self.recovered,
        }


def _lines(path: Path) -> Iterator[tuple[str, int, str]]:
    """(stamp, pid, text) per line; continuation lines keep the last header's stamp/pid."""
    stamp, pid = "", 0
    text = read_job_file(path, LOG_LIMIT, tail=True) or ""
    for raw in io.StringIO(text, newline=None):  # lines as a text file has them
        match = _LINE.match(raw.rstrip("\n"))
        if match:
            stamp, pid = match["stamp"], int(match["pid"])
            yield stamp, pid, match["text"]
        else:
            yield stamp, pid, raw.strip()


def read_faults(server_log: Path) -> list[Fault]:
    """Fatal errors in server.log, with the client PIDs that had the sticky error set."""
    faults: list[Fault] = []
    current: Fault | None = None
    collecting = False
    for stamp, pid, text in _lines(server_log):
        reporter = _FATAL_CLIENT.search(text)
        if reporter:
            if current is None or current.recovered:
                current = Fault(stamp, pid)
                faults.append(current)
            current.reported_by.append(int(reporter.group(1)))
            collecting = False
            continue
        if current is None:
            continue
        if "sticky error set" in text:
            collecting = True
            continue
        only = _PID_ONLY.match(text) or _PID_ONLY.match(text.split("]")[-1])
        if collecting and only:
            current.affected.append(int(only.group(1)))
            continue
        collecting = False
        # The H100 logs no recovery as such: its last client gone, the server destroys its
        # context, and the next client is ACTIVE again.
        if "Destroy server context" in text or "is ACTIVE" in text:
            current.recovered = True
    return faults


def terminations(server_log: Path) -> int:
    """How many ``Client termination succeeded`` lines the server wrote."""
    return sum(1 for _, _, text in _lines(server_log) if "Client termination succeeded" in text)


def server_pids(control_log: Path) -> set[int]:
    """PIDs of every server the daemon started (``Starting new server <pid> for user <uid>``)."""
    found = (_NEW_SERVER.search(text) for _, _, text in _lines(control_log))
    return {int(m.group(1)) for m in found if m}


def clients_seen(control_log: Path) -> list[int]:
    """PIDs of the clients that connected, once each, in order (``NEW CLIENT <pid> from
    user <uid>``)."""
    found = (_NEW_CLIENT.search(text) for _, _, text in _lines(control_log))
    return list(dict.fromkeys(int(m.group(1)) for m in found if m))
