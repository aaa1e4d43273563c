"""Reading the MPS control.log and server.log: fatal faults and client terminations.

Line format: ``[2026-11-22 06:53:48.123 Server 4242] <text>``; only the text is interpreted.
The logs lie in a directory the job's user owns: they are read through ``read_job_file``
(a regular file, never blocking), their last ``LOG_LIMIT`` bytes and of those their last
``LINES_LIMIT`` lines at most, and parsed in time linear in that: the header by
``str.partition``, never a backtracking expression; a line is looked at up to ``LINE_LIMIT``
characters; a PID is ASCII digits in range (``fields.pid_text``), else the line names none.
A log is parsed once (``MpsLog.read``) and every question asked of what was read
(``MpsLog``'s methods): a teardown reads each log once, however many things it counts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from .. import fields
from .._struct import Struct, field
from ..paths import GpuDirs, read_job_file

__all__ = [
    "LINES_LIMIT",
    "LOG_LIMIT",
    "Fault",
    "GpuLogs",
    "MpsLog",
    "read_faults",
    "server_pids",
    "terminations",
]

#: How much of a log is read (its end): a job's logs are a few KiB; a planted one may be huge.
LOG_LIMIT = 8 << 20
#: Lines of that end that are parsed (its last): a job's logs have some hundreds, five or so
#: per client; 8 MiB of empty lines would be 8 million, several microseconds each to parse
#: and question. 8,192 lines cost a GPU's teardown well under a tenth of a second, so that the
#: GPUs of a node, parsed one after another (one interpreter), fit ``ladder.LOGS_RESERVE``.
LINES_LIMIT = 1 << 13

#: Characters of a line that are looked at; MPS writes lines of a few dozen.
LINE_LIMIT = 1024
#: A header's ``[...]`` is found within this many characters of the line's start.
HEADER_LIMIT = 128
_FATAL_CLIENT = re.compile(
    r"Client \{PID: ([0-9]{1,10}), Context(?: ID)?: [0-9]{1,10}\} encountered a fatal"
)
_PID_ONLY = re.compile(r"\s{0,64}([0-9]{1,10})\s{0,64}")
_NEW_SERVER = re.compile(r"Starting new server ([0-9]{1,10})")
_NEW_CLIENT = re.compile(r"NEW CLIENT ([0-9]{1,10}) from user")


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


def _pid(word: str) -> int | None:
    try:
        return fields.pid_text(word)
    except fields.FieldError:
        return None


def _header(line: str) -> tuple[str, int, str] | None:
    """(stamp, pid, text) of ``[<stamp> <who> <pid>] <text>``, None for another line."""
    if not line.startswith("["):
        return None
    head, sep, text = line[1:HEADER_LIMIT].partition("]")
    words = head.split()
    if not sep or len(words) < 2:
        return None
    pid = _pid(words[-1])
    if pid is None:
        return None
    rest = text + line[HEADER_LIMIT:]
    return " ".join(words[:-2]), pid, rest[1:] if rest.startswith(" ") else rest


def _last_lines(text: str, limit: int) -> list[str]:
    """The last ``limit`` lines of ``text`` (any line ending, as a text file has them), each
    up to ``LINE_LIMIT`` characters: found from the end, never by splitting the whole."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    start = len(text) - 1 if text.endswith("\n") else len(text)
    for _ in range(limit):
        start = text.rfind("\n", 0, start)
        if start < 0:
            break
    lines = text[start + 1 :].split("\n")
    if lines and not lines[-1]:
        lines.pop()  # after the last line's end
    return [line[:LINE_LIMIT] for line in lines]


def _parse(lines: list[str]) -> Iterator[tuple[str, int, str]]:
    """(stamp, pid, text) per line; continuation lines keep the last header's stamp/pid."""
    stamp, pid = "", 0
    for line in lines:
        found = _header(line)
        if found:
            stamp, pid, body = found
            yield stamp, pid, body
        else:
            yield stamp, pid, line.strip()


def _pids(pattern: re.Pattern[str], text: str) -> Iterator[int]:
    """The PIDs ``pattern``'s first group finds in ``text``, those in range only."""
    for match in pattern.finditer(text):
        pid = _pid(match.group(1))
        if pid is not None:
            yield pid


class MpsLog(Struct, frozen=True):
    """One log as read once (``read``): (stamp, pid, text) of each of its last lines."""

    lines: list[tuple[str, int, str]] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> MpsLog:
        """``path``'s last ``LOG_LIMIT`` bytes and ``LINES_LIMIT`` lines (none: absent, or
        not a regular file of one link)."""
        text = read_job_file(path, LOG_LIMIT, tail=True) or ""
        return cls(list(_parse(_last_lines(text, LINES_LIMIT))))

    def faults(self) -> list[Fault]:
        """Fatal errors in server.log, with the client PIDs that had the sticky error set."""
        faults: list[Fault] = []
        current: Fault | None = None
        collecting = False
        for stamp, pid, text in self.lines:
            reporter = next(_pids(_FATAL_CLIENT, text), None)
            if reporter is not None:
                if current is None or current.recovered:
                    current = Fault(stamp, pid)
                    faults.append(current)
                current.reported_by.append(reporter)
                collecting = False
                continue
            if current is None:
                continue
            if "sticky error set" in text:
                collecting = True
                continue
            only = _PID_ONLY.fullmatch(text) or _PID_ONLY.fullmatch(text.rpartition("]")[2])
            affected = _pid(only.group(1)) if collecting and only else None
            if affected is not None:
                current.affected.append(affected)
                continue
            collecting = False
            # The H100 logs no recovery as such: its last client gone, the server destroys its
            # context, and the next client is ACTIVE again.
            if "Destroy server context" in text or "is ACTIVE" in text:
                current.recovered = True
        return faults

    def terminations(self) -> int:
        """How many ``Client termination succeeded`` lines the server wrote."""
        return sum(1 for _, _, text in self.lines if "Client termination succeeded" in text)

    def server_pids(self) -> set[int]:
        """PIDs of every server the daemon started (``Starting new server <pid> for user
        <uid>``)."""
        return {pid for _, _, text in self.lines for pid in _pids(_NEW_SERVER, text)}

    def clients_seen(self) -> list[int]:
        """PIDs of the clients that connected, once each, in order (``NEW CLIENT <pid> from
        user <uid>``)."""
        found = (pid for _, _, text in self.lines for pid in _pids(_NEW_CLIENT, text))
        return list(dict.fromkeys(found))


class GpuLogs(Struct, frozen=True):
    """Both logs of one GPU's daemon, each read once (none read: ``GpuLogs()``)."""

    control: MpsLog = field(default_factory=MpsLog)
    server: MpsLog = field(default_factory=MpsLog)

    @classmethod
    def read(cls, dirs: GpuDirs, *, control: bool = True) -> GpuLogs:
        """Both logs; ``control`` False: server.log only (control.log is left unopened)."""
        return cls(
            MpsLog.read(dirs.control_log) if control else MpsLog(),
            MpsLog.read(dirs.server_log),
        )


def read_faults(server_log: Path) -> list[Fault]:
    """``MpsLog.faults`` of ``server_log``."""
    return MpsLog.read(server_log).faults()


def terminations(server_log: Path) -> int:
    """``MpsLog.terminations`` of ``server_log``."""
    return MpsLog.read(server_log).terminations()


def server_pids(control_log: Path) -> set[int]:
    """``MpsLog.server_pids`` of ``control_log``."""
    return MpsLog.read(control_log).server_pids()
