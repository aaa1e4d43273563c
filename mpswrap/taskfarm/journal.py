"""THE record of a farm: its journal, and the directory it lives in with the tasks' logs.

Everything a farm writes lives in its directory (``--dir``, default ``<TASKS>.farm`` beside
the task list): ``logs/NNNN-HASH.out`` and ``.err`` for attempt 1 (the task's number and its
command's hash), ``NNNN-HASH.A.out`` for attempt A; one journal per share of the tasks
(``state.jsonl``, or ``state-IofN.jsonl`` for share I of N) and, beside it, the same attempts
in GNU parallel's ``--joblog`` format (``joblog``, ``joblog-IofN``: ``joblog``); a lock file
per share, held while a farm runs.

The journal is JSON lines, each appended with one write, so a farm ended at any moment leaves
whole lines: events (``event``: ``farm`` when a farm begins, ``k`` for each GPU's K as it
starts and changes, ``start`` for each attempt, ``exit`` for a failed attempt whose process
ended while its record waits for the verdict, ``halt`` when it starts no more tasks (a
``--halt``, a signal), ``end`` when the farm ends) and one record per
finished attempt (``TaskRecord``). Every view of a farm (its progress line, its summary, the
node's summary line, ``farm status``, the run record metrics read) is a fold of these lines
(``fold``). Each task is settled by one record across every journal of the directory, whatever
``--share`` layout wrote it (``settled``): a ``done`` one, else the latest; a task done is not
run again, and ``farm status`` says of each task what that record says. The key is the
command's text (and which occurrence of it), so an edited line runs again and reordering
lines runs nothing twice.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .. import fields
from .._lock import held_elsewhere
from ..errors import LayoutError, UsageError
from ..paths import list_dir, read_job_file, uncreatable
from .tasks import WHOLE, Share, Task

__all__ = [
    "DONE",
    "FAILED",
    "FAULT",
    "INTERRUPTED",
    "OOM",
    "TIMEOUT",
    "FarmDir",
    "TaskRecord",
    "read_journal",
    "record_of",
    "settled",
    "share_of",
]

#: Statuses of a finished attempt: exit 0; a failure of its own; ended by a fatal GPU fault of
#: its server; out of GPU memory while its GPU was full; past ``--timeout``; ended because the
#: farm was told to stop (a signal, ``--halt now``): run again by the next farm.
DONE, FAILED, FAULT, OOM = "done", "failed", "fault", "oom"
TIMEOUT, INTERRUPTED = "timeout", "interrupted"
STATUSES = (DONE, FAILED, FAULT, OOM, TIMEOUT, INTERRUPTED)
#: A journal line longer than this was not written by a farm.
RECORD_LIMIT = 1 << 16
#: ``farm status`` reads a journal up to this size (a record is a few hundred bytes).
STATE_LIMIT = 256 << 20
_T = TypeVar("_T")
_STATE = re.compile(r"state(-(\d+)of(\d+))?\.jsonl")


# A dataclass, not a Struct: a farm's result (entry/farm.FarmResult) holds them, and callers'
# dataclasses.asdict of it must give plain data.
@dataclass(frozen=True)
class TaskRecord:
    """One finished attempt: a line of the journal."""

    task: int
    key: str
    command: str
    attempt: int
    status: str  # one of STATUSES
    code: int  # shell style: 128+N after signal N
    node: str
    gpu: str  # UUID
    gpu_index: int
    start: float
    end: float
    stdout: str
    stderr: str
    #: Its task went back to the queue (a fault's, an oom's, a failure with --retries left).
    retried: bool = False
    #: Seen among its GPU server's clients; None: it ended before a check could see it (no
    #: CUDA, or too short to be listed), or no check was asked for.
    attached: bool | None = None
    #: The signal that ended it (0: it exited).
    signal: int = 0
    #: Its MPS clients that terminate_client ended (a stop, a --timeout, --halt now).
    terminated: int = 0

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


class FarmDir:
    """A farm's directory: its logs, its journal and its joblog (see the module's text)."""

    def __init__(self, path: str | os.PathLike[str], share: Share = WHOLE) -> None:
        self.path = Path(path)
        self.share = share
        self.logs = self.path / "logs"
        self._fd: int | None = None
        self._torn = False

    def create(self) -> FarmDir:
        try:
            self.logs.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._refused(exc.strerror) from None
        return self

    def check(self) -> None:
        """Refuse what ``create`` and the farm's lock would refuse, creating nothing (a dry
        run)."""
        why = uncreatable(self.logs)
        if why:
            raise self._refused(why)
        if held_elsewhere(self.lock_path):
            raise self.busy()

    def busy(self) -> UsageError:
        """Another farm holds this directory's lock for this share."""
        return UsageError(
            "another farm runs in this directory",
            thing=str(self.path),
            hint="wait for it, or give --dir another directory",
        )

    def _refused(self, why: str | None) -> UsageError:
        """A path the user gave (or the default here) where no farm can write: exit 2."""
        return UsageError(
            "cannot create the farm directory",
            thing=str(self.logs),
            cause=why,
            hint="give --dir a directory you can write",
        )

    @property
    def lock_path(self) -> Path:
        return self.path / f".{self.share.state_name}.lock"

    @property
    def journal_path(self) -> Path:
        return self.path / self.share.state_name

    @property
    def joblog_path(self) -> Path:
        return self.path / f"joblog{self.share.suffix}"

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

    def write(self, data: dict[str, Any]) -> None:
        """One line, one write (O_APPEND), so that a farm ended at any moment leaves whole
        lines. The journal stays open while the farm runs (``close``). A line starts on a
        line of its own where the journal ends in a torn one (a full disk, a crash): glued
        onto it, it would be lost with it. A write that fails or falls short raises, as the
        farm's record would otherwise be silently incomplete."""
        if self._fd is None:
            flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            self._fd = self._guard(lambda: os.open(self.journal_path, flags, 0o644))
            self._torn = self._guard(lambda: _ends_torn(self._fd))
        line = ("\n" if self._torn else "") + json.dumps(data, sort_keys=True) + "\n"
        self._torn = True  # until the whole line is written
        self._guard(lambda: _write_all(self._fd, line.encode()))
        self._torn = False

    def _guard(self, call: Callable[[], _T]) -> _T:
        try:
            return call()
        except OSError as exc:
            raise LayoutError(
                "cannot write the farm's journal", thing=str(self.journal_path), cause=exc.strerror
            ) from exc

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def last_status(self) -> dict[str, str]:
        """Each task key's settled status in the directory (``settled``): what a farm run
        again skips (done; failed too with ``--skip-failed``)."""
        return {key: r.status for key, r in settled(read_journal(self.path)).items()}


def settled(journals: Mapping[str, Iterable[dict[str, Any]]]) -> dict[str, TaskRecord]:
    """Each task key's record that settles it across every journal of a farm's directory,
    whatever ``--share`` layout wrote them: a ``done`` record wins (a task done anywhere is
    not run again), else the latest to end. What a farm run again leaves out and what
    ``farm status`` says of each task are both this."""
    out: dict[str, TaskRecord] = {}
    for lines in journals.values():
        for record in map(record_of, lines):
            if record is None or record.retried:
                continue
            old = out.get(record.key)
            if old is None or (old.status != DONE and _later(record, old)):
                out[record.key] = record
    return out


def _later(record: TaskRecord, old: TaskRecord) -> bool:
    return record.status == DONE or record.end >= old.end


def share_of(name: str) -> Share:
    """The share a journal's name tells (``state-IofN.jsonl``; ``state.jsonl``: the whole)."""
    match = _STATE.fullmatch(name)
    if not match or not match.group(1):
        return WHOLE
    return Share(int(match.group(2)), int(match.group(3)))


def _ends_torn(fd: int | None) -> bool:
    """Whether the file's last byte is no newline (an empty file ends whole)."""
    assert fd is not None
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


def _write_all(fd: int | None, data: bytes) -> None:
    """Every byte, or an OSError: a short write (a disk filling up) is written on, and one
    that writes nothing is an error of its own."""
    assert fd is not None
    while data:
        written = os.write(fd, data)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        data = data[written:]


def read_journal(directory: str | os.PathLike[str]) -> dict[str, list[dict[str, Any]]]:
    """Each journal of a farm's directory (by name), its lines in order, as ``farm status``
    reads them from any shell: the directory as named (its links followed, as ``cd`` would),
    the files in it through ``paths.read_job_file`` (no link, no FIFO, at most
    ``STATE_LIMIT`` bytes). A LayoutError when it is no directory or a journal is refused;
    an empty mapping when it has none."""
    real = Path(os.path.realpath(directory))
    names = list_dir(real, "cannot read the farm directory")
    if names is None:
        raise LayoutError("no such farm directory", thing=str(directory))
    journal: dict[str, list[dict[str, Any]]] = {}
    for name in sorted(n for n in names if _STATE.fullmatch(n)):
        text = read_job_file(real / name, STATE_LIMIT)
        if text is None:
            raise LayoutError("cannot read the farm's state file", thing=str(real / name))
        journal[name] = [d for d in map(_line, text.splitlines()) if d is not None]
    return journal


def _line(line: str) -> dict[str, Any] | None:
    if len(line) > RECORD_LIMIT:
        return None
    try:
        data = fields.json_value(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def record_of(data: dict[str, Any]) -> TaskRecord | None:
    """A finished attempt from a journal line's data; None for an event or a stray line."""
    if "event" in data:
        return None
    try:
        record = TaskRecord(**data)
    except TypeError:
        return None
    return record if _typed(record) else None


#: What each field of a record must be (a journal edited by hand is read, never trusted).
_TYPES: dict[str, type | tuple[type, ...]] = {
    **dict.fromkeys(("task", "attempt", "code", "gpu_index", "signal", "terminated"), int),
    **dict.fromkeys(("start", "end"), (int, float)),
    **dict.fromkeys(("key", "command", "node", "gpu", "stdout", "stderr"), str),
}


def _typed(record: TaskRecord) -> bool:
    values = vars(record)  # a flat record: no copy needed
    if any(isinstance(values[k], bool) or not isinstance(values[k], t) for k, t in _TYPES.items()):
        return False
    finite = all(abs(values[k]) < 1e12 for k in ("start", "end"))
    flags = isinstance(record.retried, bool) and record.attached in (True, False, None)
    return finite and flags and record.status in STATUSES


def as_line(record: TaskRecord) -> dict[str, Any]:
    """A record as its journal line (its fields are plain values: ``asdict`` without the
    deep copy)."""
    return dict(vars(record))
