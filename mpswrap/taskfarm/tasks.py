"""A task farm's tasks: the task list, read and checked whole before anything starts, and the
share of it one farm runs.

A task list has one command per line; blank lines and lines starting with ``#`` are not
tasks. Tasks are numbered from 0 in file order (``MPSWRAP_TASK``). Every line is a shell
command line and runs as ``/bin/sh -c LINE`` (as GNU parallel runs its lines): ``exit 5``
exits 5, a missing program exits 127 with the shell's "not found". The task's program is then
a child of that shell. A line with a NUL byte, one that is not UTF-8, or one longer than
``LINE_LIMIT`` bytes is a UsageError naming it (``tasks.txt:3: ...``).

The list is a file someone wrote: it is read up to ``LIST_LIMIT`` bytes, from a regular file
or a pipe (``-``, ``<(...)``); anything else (``/dev/zero``, a directory, a socket) is refused
before a byte is read.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import re
import select
import shlex
import stat
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from .._struct import Struct
from ..errors import UsageError

__all__ = ["WHOLE", "Share", "Task", "parse_share", "parse_tasks", "read_tasks", "task_lines"]

#: A task line longer than this (bytes) is refused: no command line is that long on purpose,
#: and the kernel refuses an argument past 128 KiB (MAX_ARG_STRLEN) anyway.
LINE_LIMIT = 1 << 16
#: A task list longer than this is refused: a million tasks of a hundred bytes fit.
LIST_LIMIT = 256 << 20
_SHARE = re.compile(r"^([0-9]{1,6})/([1-9][0-9]{0,5})$")


# Task is a dataclass, not a Struct: a farm's result (entry/farm.FarmResult) holds them, and
# callers' dataclasses.asdict of it must give plain data. Slots: a farm of 10,000 tasks holds
# 10,000 of them (2.7 MB less than with a __dict__ each).
@dataclass(frozen=True, slots=True)
class Task:
    """One line of the task list."""

    number: int
    command: str
    key: str  # the command's hash and its occurrence: stable when lines move
    line: int = 0  # its line in the list, from 1 (0: not from a list)

    @property
    def log_stem(self) -> str:
        """``NNNN-<hash>``: its number for people, its key so that a finished task's logs are
        never another's after the list was edited."""
        digest, _, occurrence = self.key.partition("-")
        return f"{self.number:04d}-{digest[:8]}" + ("" if occurrence == "1" else f"-{occurrence}")

    @property
    def argv(self) -> list[str]:
        """How it runs: a shell command line (written out: the security test's scan counts
        the package's shell calls, and this is its one)."""
        return ["/bin/sh", "-c", self.command]


def parse_tasks(lines: Iterable[str], source: str = "tasks") -> list[Task]:
    """Tasks of a list; a line that is no command line (a NUL byte, an open quote, too long)
    is a UsageError naming ``source`` and its line number."""
    tasks: list[Task] = []
    seen: Counter[str] = Counter()
    for line_no, raw in enumerate(lines, 1):
        command = raw.strip()
        if not command or command.startswith("#"):
            continue
        _check_line(command, source, line_no)
        seen[command] += 1
        digest = hashlib.sha256(command.encode()).hexdigest()[:16]
        tasks.append(Task(len(tasks), command, f"{digest}-{seen[command]}", line_no))
    return tasks


def _check_line(command: str, source: str, line_no: int) -> None:
    if "\0" in command:
        raise _bad_line(source, line_no, "the line has a NUL byte")
    try:
        size = len(command.encode())
    except UnicodeEncodeError:
        raise _bad_line(source, line_no, "the line is not UTF-8 text") from None
    if size > LINE_LIMIT:
        raise _too_long(source, line_no, size)
    try:
        shlex.split(command)
    except ValueError as exc:
        raise UsageError(
            f"{source}:{line_no}: bad task: {exc}", hint="quote as in a shell script"
        ) from None


def _bad_line(source: str, line_no: int, what: str) -> UsageError:
    return UsageError(
        f"{source}:{line_no}: {what}", hint="a task list is text: one command line per line"
    )


def _too_long(source: str, line_no: int, size: int) -> UsageError:
    return UsageError(
        f"{source}:{line_no}: the line is longer than {LINE_LIMIT // 1024} KiB ({size} bytes)",
        hint="put long arguments in a file the command reads",
    )


def task_lines(data: bytes, source: str) -> list[str]:
    """The lines of a task list's bytes, each checked in order: at most ``LINE_LIMIT`` bytes,
    no NUL byte, UTF-8 (else a UsageError naming the first line that is not). A byte-order
    mark that starts the list (an editor's UTF-8 "with BOM") is no part of its first task."""
    lines = []
    data = data.removeprefix(codecs.BOM_UTF8)
    for line_no, raw in enumerate(data.splitlines(), 1):
        if len(raw) > LINE_LIMIT:
            raise _too_long(source, line_no, len(raw))
        if b"\0" in raw:
            raise _bad_line(source, line_no, "the line has a NUL byte")
        try:
            lines.append(raw.decode())
        except UnicodeDecodeError as exc:
            where = f"byte 0x{raw[exc.start]:02x} at column {exc.start + 1}"
            raise _bad_line(source, line_no, f"the line is not UTF-8 text ({where})") from None
    return lines


def read_tasks(source: str) -> list[Task]:
    """The tasks of a file, or of standard input for ``-``, checked before anything starts."""
    name = "stdin" if source == "-" else source
    if source == "-":
        try:
            os.fstat(0)
        except OSError as exc:  # started with standard input closed (``<&-``)
            cause = f"standard input: {exc.strerror}"
            raise UsageError("cannot read the task list", thing=name, cause=cause) from None
        data = _read_list(0, name)
    else:
        fd = _open_list(source)
        try:
            if _named_pipe(source):  # wait for its writer, as cat does: opened before one
                select.select([fd], [], [])  # came, it reads as empty at once
            data = _read_list(fd, name)
        finally:
            os.close(fd)
    return parse_tasks(task_lines(data, name), name)


def _named_pipe(source: str) -> bool:
    """A FIFO of a file system (``mkfifo``), not a pipe's ``/dev/fd/N`` (bash's ``<(...)``,
    a link): Linux reports the end of a named pipe only once a writer came and went."""
    try:
        return stat.S_ISFIFO(os.lstat(source).st_mode)
    except OSError:
        return False


def _open_list(source: str) -> int:
    try:
        return os.open(source, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise UsageError(
            "cannot read the task list",
            thing=source,
            cause=exc.strerror,
            hint="give a file with one command per line, or - for standard input",
        ) from None


def _read_list(fd: int, name: str) -> bytes:
    """At most ``LIST_LIMIT`` bytes of a regular file, a pipe or a character device
    (``/dev/null``: no tasks; ``/dev/zero`` ends at the limit); more, a terminal (it would
    wait for typing) or anything else is a UsageError."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISCHR(mode) and os.isatty(fd):
        raise UsageError(
            "cannot read the task list",
            thing=name,
            cause="a terminal",
            hint="give a file with one command per line, or pipe the list into -",
        )
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        raise UsageError(
            "cannot read the task list",
            thing=name,
            cause="not a file, a pipe or a character device",
            hint="give a file with one command per line, or - for standard input",
        )
    os.set_blocking(fd, True)  # a pipe is read to its end, as `cat` would
    chunks: list[bytes] = []
    size = 0
    while size <= LIST_LIMIT:
        try:
            chunk = os.read(fd, 1 << 20)
        except OSError as exc:
            raise UsageError("cannot read the task list", thing=name, cause=exc.strerror) from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    raise UsageError(
        "cannot read the task list",
        thing=name,
        cause=f"larger than {LIST_LIMIT >> 20} MiB",
        hint="split it over several farms (--dir) or shares (--share I/N)",
    )


class Share(Struct, frozen=True):
    """Which tasks this farm runs: task numbers ``index`` modulo ``count`` (one share per node
    of ``srun --ntasks-per-node=1 mpswrap farm``)."""

    index: int = 0
    count: int = 1

    def picks(self, task: Task) -> bool:
        return self.has(task.number)

    def has(self, number: int) -> bool:
        """Whether task ``number`` (from 0) is this share's."""
        return number % self.count == self.index

    @property
    def suffix(self) -> str:
        """What names this share's files: empty for the whole list, ``-IofN`` else."""
        return "" if self.count == 1 else f"-{self.index}of{self.count}"

    @property
    def state_name(self) -> str:
        return f"state{self.suffix}.jsonl"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


#: The whole task list, one farm's share when it is not split over nodes.
WHOLE = Share()


def parse_share(text: str) -> Share:
    """``I/N`` (0 <= I < N)."""
    match = _SHARE.match(text)
    if not match or int(match[1]) >= int(match[2]):
        raise UsageError("bad --share", thing=text, cause="expected I/N with 0 <= I < N, e.g. 0/4")
    return Share(int(match[1]), int(match[2]))
