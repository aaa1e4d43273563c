"""A task farm's tasks and its record: the task list, each task's logs, and the state file.

A task list has one command per line; blank lines and lines starting with ``#`` are not
tasks. Tasks are numbered from 0 in file order (``MPSWRAP_TASK``). Every line is a shell
command line and runs as ``/bin/sh -c LINE`` (as GNU parallel runs its lines): ``exit 5``
exits 5, a missing program exits 127 with the shell's "not found". The task's program is then
a child of that shell, found as a descendant of the task (``supervise.Rank.tree``) when its
clients are checked and ended. The list is read and checked whole before anything starts: a
line with a NUL byte, one that is not UTF-8, or one longer than ``LINE_LIMIT`` bytes is a
UsageError naming it (``tasks.txt:3: ...``).

Everything a farm writes lives in its directory (``--dir``, default ``<TASKS>.farm`` beside
the task list): ``logs/NNNN-HASH.out`` and ``.err`` for attempt 1 (the task's number and
its command's hash), ``NNNN-HASH.A.out`` for attempt A; and one state file per share of the
tasks (``state.jsonl``, or ``state-IofN.jsonl`` for share I of N), a JSON line per finished
attempt, appended with one write each, and the farm's events (``event``: ``farm`` when a farm
begins, ``start`` for each attempt it starts, ``end`` when it ends), which ``farm status``
reads; a lock file per share, held while a farm runs. A task
whose command has a ``done`` line in any state file of the directory is not run again: the
key is the command's text (and which occurrence of it), so an edited line runs again and
reordering lines runs nothing twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._struct import Struct
from ..errors import LayoutError, UsageError
from ..paths import list_dir, read_job_file

__all__ = [
    "FarmDir",
    "Share",
    "Task",
    "TaskRecord",
    "parse_share",
    "parse_tasks",
    "read_journal",
    "read_tasks",
    "record_of",
    "task_lines",
]

#: Statuses of a finished attempt: exit 0; a failure of its own; ended by a fatal GPU fault
#: of its server (retried while retries are left); out of GPU memory while its GPU was full
#: (retried up to ``OOM_TRIES`` runs in all).
DONE, FAILED, FAULT, OOM = "done", "failed", "fault", "oom"
#: Runs of a task that keeps running out of memory, the first one included.
OOM_TRIES = 3
#: A state line longer than this was not written by a farm.
RECORD_LIMIT = 1 << 16
#: A task line longer than this (bytes) is refused: no command line is that long on purpose,
#: and the kernel refuses an argument past 128 KiB (MAX_ARG_STRLEN) anyway.
LINE_LIMIT = 1 << 16
#: ``farm status`` reads a state file up to this size (a record is a few hundred bytes).
STATE_LIMIT = 64 << 20
_SHARE = re.compile(r"^([0-9]{1,6})/([1-9][0-9]{0,5})$")


# Task and TaskRecord are dataclasses, not Structs: a farm's result (entry/farm.FarmResult)
# holds them, and callers' dataclasses.asdict of it must give plain data.
@dataclass(frozen=True)
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
    no NUL byte, UTF-8 (else a UsageError naming the first line that is not)."""
    lines = []
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
    if source == "-":
        return parse_tasks(task_lines(sys.stdin.buffer.read(), "stdin"), "stdin")
    try:
        data = Path(source).read_bytes()
    except OSError as exc:
        raise UsageError("cannot read the task list", thing=source, cause=exc.strerror) from None
    return parse_tasks(task_lines(data, source), source)


class Share(Struct, frozen=True):
    """Which tasks this farm runs: task numbers ``index`` modulo ``count`` (one share per node
    of ``srun --ntasks-per-node=1 mpswrap farm``)."""

    index: int = 0
    count: int = 1

    def picks(self, task: Task) -> bool:
        return task.number % self.count == self.index

    @property
    def state_name(self) -> str:
        return "state.jsonl" if self.count == 1 else f"state-{self.index}of{self.count}.jsonl"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


#: The whole task list, one farm's share when it is not split over nodes.
WHOLE = Share()


def parse_share(text: str) -> Share:
    """``I/N`` (0 <= I < N)."""
    match = _SHARE.match(text)
    if not match or int(match[1]) >= int(match[2]):
        raise UsageError("bad --share", thing=text, hint="use I/N with 0 <= I < N, e.g. 0/4")
    return Share(int(match[1]), int(match[2]))


@dataclass(frozen=True)
class TaskRecord:
    """One finished attempt: a line of the state file."""

    task: int
    key: str
    command: str
    attempt: int
    status: str  # DONE, FAILED, FAULT or OOM
    code: int
    node: str
    gpu: str  # UUID
    gpu_index: int
    start: float
    end: float
    stdout: str
    stderr: str
    #: A fault's or oom's attempt whose task went back to the queue (not settled by it).
    retried: bool = False

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


class FarmDir:
    """A farm's directory: its logs and its state files (see the module's text)."""

    def __init__(self, path: str | os.PathLike[str], share: Share = WHOLE) -> None:
        self.path = Path(path)
        self.share = share
        self.logs = self.path / "logs"

    def create(self) -> FarmDir:
        try:
            self.logs.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LayoutError(
                "cannot create the farm directory", thing=str(self.logs), cause=exc.strerror
            ) from None
        return self

    @property
    def lock_path(self) -> Path:
        return self.path / f".{self.share.state_name}.lock"

    def log_paths(self, task: Task, attempt: int) -> tuple[Path, Path]:
        stem = task.log_stem + ("" if attempt == 1 else f".{attempt}")
        return self.logs / f"{stem}.out", self.logs / f"{stem}.err"

    def open_logs(self, task: Task, attempt: int) -> tuple[int, int]:
        """Descriptors of the attempt's two logs, created or truncated."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        out, err = self.log_paths(task, attempt)
        try:
            first = os.open(out, flags, 0o644)
        except OSError as exc:
            raise LayoutError(
                "cannot write a task log", thing=str(out), cause=exc.strerror
            ) from None
        try:
            return first, os.open(err, flags, 0o644)
        except OSError as exc:
            os.close(first)
            raise LayoutError(
                "cannot write a task log", thing=str(err), cause=exc.strerror
            ) from None

    def append(self, record: TaskRecord) -> None:
        """One line, one write, so that a farm ended at any moment leaves whole lines."""
        self._append(asdict(record))

    def event(self, kind: str, **fields: Any) -> None:
        """One of the farm's events (``farm``, ``start``, ``end``), a line of the state file."""
        self._append({"event": kind, **fields})

    def _append(self, data: dict[str, Any]) -> None:
        line = json.dumps(data, sort_keys=True) + "\n"
        path = self.path / self.share.state_name
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def records(self) -> Iterator[TaskRecord]:
        """Every attempt in every state file of the directory; lines that are not records
        (events, lines cut short or edited by hand) are passed over."""
        names = sorted(p for p in self.path.glob("state*.jsonl") if p.is_file())
        for path in names:
            with open(path, errors="replace") as lines:
                for line in lines:
                    record = _record(line)
                    if record is not None:
                        yield record

    def finished(self) -> set[str]:
        """Keys of the tasks with a ``done`` attempt."""
        return {r.key for r in self.records() if r.status == DONE}


def read_journal(directory: str | os.PathLike[str]) -> dict[str, list[dict[str, Any]]]:
    """Each state file of a farm's directory (by name), its lines in order, as ``farm status``
    reads them from any shell: the directory as named (its links followed, as ``cd`` would),
    the files in it through ``paths.read_job_file`` (no link, no FIFO, at most
    ``STATE_LIMIT`` bytes). A LayoutError when it is no directory or a state file is refused;
    an empty mapping when it has no state file."""
    real = Path(os.path.realpath(directory))
    names = list_dir(real, "cannot read the farm directory")
    if names is None:
        raise LayoutError("no such farm directory", thing=str(directory))
    journal: dict[str, list[dict[str, Any]]] = {}
    for name in sorted(n for n in names if re.fullmatch(r"state(-\d+of\d+)?\.jsonl", n)):
        text = read_job_file(real / name, STATE_LIMIT)
        if text is None:
            raise LayoutError("cannot read the farm's state file", thing=str(real / name))
        journal[name] = [d for d in map(_line, text.splitlines()) if d is not None]
    return journal


def _line(line: str) -> dict[str, Any] | None:
    if len(line) > RECORD_LIMIT:
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _record(line: str) -> TaskRecord | None:
    data = _line(line)
    return record_of(data) if data is not None else None


def record_of(data: dict[str, Any]) -> TaskRecord | None:
    """A finished attempt from a state line's data; None for an event or a stray line."""
    if "event" in data:
        return None
    try:
        return TaskRecord(**data)
    except TypeError:
        return None
