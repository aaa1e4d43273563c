"""A task farm's tasks and its record: the task list, each task's logs, and the state file.

A task list has one command per line; blank lines and lines starting with ``#`` are not
tasks. Tasks are numbered from 0 in file order (``MPSWRAP_TASK``). A line with shell syntax
(pipes, redirections, variables, ``&&``, globs) runs under ``/bin/sh -c``; any other line is
split like a shell would and run directly, so the task's process is the program itself.

Everything a farm writes lives in its directory (``--dir``, default ``<TASKS>.farm`` beside
the task list): ``logs/NNNN-HASH.out`` and ``.err`` for attempt 1 (the task's number and
its command's hash), ``NNNN-HASH.A.out`` for attempt A; and one state file per share of the
tasks (``state.jsonl``, or ``state-IofN.jsonl`` for share I of N), a JSON line per finished
attempt, appended with one write each; a lock file per share, held while a farm runs. A task
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

from ..errors import LayoutError, UsageError

__all__ = [
    "FarmDir",
    "Share",
    "Task",
    "TaskRecord",
    "parse_share",
    "parse_tasks",
    "read_tasks",
]

#: Statuses of a finished attempt: exit 0; a failure of its own; ended by a fatal GPU fault
#: of its server (retried while retries are left).
DONE, FAILED, FAULT = "done", "failed", "fault"
#: A state line longer than this was not written by a farm.
RECORD_LIMIT = 1 << 16
#: Characters that make a line shell syntax rather than a plain command.
_SHELL = re.compile(
    r"[|&;<>()$`*?\[\]{}~\n\\]|\s#|(^|\s)[A-Za-z_][A-Za-z0-9_]*="
    r"|^\s*(cd|export|exec|source|\.|ulimit|umask|eval|set|unset|trap|wait|time)(\s|$)"
)
_SHARE = re.compile(r"^([0-9]{1,6})/([1-9][0-9]{0,5})$")


@dataclass(frozen=True)
class Task:
    """One line of the task list."""

    number: int
    command: str
    key: str  # the command's hash and its occurrence: stable when lines move

    @property
    def log_stem(self) -> str:
        """``NNNN-<hash>``: its number for people, its key so that a finished task's logs are
        never another's after the list was edited."""
        digest, _, occurrence = self.key.partition("-")
        return f"{self.number:04d}-{digest[:8]}" + ("" if occurrence == "1" else f"-{occurrence}")

    @property
    def argv(self) -> list[str]:
        """How it runs: split, or through ``/bin/sh -c`` when it has shell syntax."""
        if _SHELL.search(self.command):
            return ["/bin/sh", "-c", self.command]
        return shlex.split(self.command)


def parse_tasks(lines: Iterable[str]) -> list[Task]:
    """Tasks of a list; a line that does not split (an open quote) is a UsageError naming it."""
    tasks: list[Task] = []
    seen: Counter[str] = Counter()
    for line_no, raw in enumerate(lines, 1):
        command = raw.strip()
        if not command or command.startswith("#"):
            continue
        try:
            shlex.split(command)
        except ValueError as exc:
            raise UsageError(f"bad task on line {line_no}", thing=command, cause=str(exc)) from None
        seen[command] += 1
        digest = hashlib.sha256(command.encode()).hexdigest()[:16]
        tasks.append(Task(len(tasks), command, f"{digest}-{seen[command]}"))
    return tasks


def read_tasks(source: str) -> list[Task]:
    """The tasks of a file, or of standard input for ``-``."""
    if source == "-":
        return parse_tasks(sys.stdin.read().splitlines())
    try:
        text = Path(source).read_text(errors="replace")
    except OSError as exc:
        raise UsageError("cannot read the task list", thing=source, cause=exc.strerror) from None
    return parse_tasks(text.splitlines())


@dataclass(frozen=True)
class Share:
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
    status: str  # DONE, FAILED or FAULT
    code: int
    node: str
    gpu: str  # UUID
    gpu_index: int
    start: float
    end: float
    stdout: str
    stderr: str

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


class FarmDir:
    """A farm's directory: its logs and its state files (see the module's text)."""

    def __init__(self, path: str | os.PathLike[str], share: Share = Share()) -> None:
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
        line = json.dumps(asdict(record), sort_keys=True) + "\n"
        path = self.path / self.share.state_name
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def records(self) -> Iterator[TaskRecord]:
        """Every attempt in every state file of the directory; lines that are not records
        (cut short, edited by hand) are passed over."""
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


def _record(line: str) -> TaskRecord | None:
    if len(line) > RECORD_LIMIT:
        return None
    try:
        data = json.loads(line)
        return TaskRecord(**data) if isinstance(data, dict) else None
    except (ValueError, TypeError):
        return None
