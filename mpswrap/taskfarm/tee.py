"""A farm's tasks' output, live (``mpswrap farm --tag``), as ``parallel --tag --line-buffer``.

Each task writes to two pipes instead of its log files; the farm's wait loop wakes when one
is readable and copies every byte to the task's log file (the files are the same as without
``--tag``), and each whole line, prefixed by the task's number and a tab, to the farm's own
stdout (the task's stdout) or stderr (its stderr). Lines of different tasks never mix within
a line: a line is written only once its newline came (or it grew past ``LINE_LIMIT``, or its
task closed the pipe). One thread, no locks: the loop that watches the tasks reads them.

A task whose farm was killed outright (SIGKILL) has no reader any more: its guard ends it
through the ladder, as without ``--tag``, but its last output may be lost.

The farm's own output may be a pipe nobody reads (``farm --tag | less``, paused) or a stopped
terminal. The loop that writes it also reaps tasks and handles signals, so it never waits on
it: lines the stream cannot take now are not shown (the logs still get them), and the farm
says how many at the end.
"""

from __future__ import annotations

import os
import select
import time
from typing import TextIO

from .._struct import Struct

__all__ = ["Tee"]

#: A line without its newline is written anyway once it is this long (a progress bar's \r).
LINE_LIMIT = 1 << 16
#: Bytes read from a pipe at once.
CHUNK = 1 << 16


class _Pipe(Struct):
    """The read end of one task's stdout or stderr, its log file, and the line so far."""

    fd: int
    log: int
    tag: bytes
    stream: TextIO | None
    partial: bytes = b""


class Tee:
    """The pipes of the running tasks, read when the wait loop wakes (``pump``)."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err
        self.pipes: list[_Pipe] = []
        #: Lines not shown because their stream could not take them without waiting.
        self.dropped = 0

    def attach(self, tag: str, out_log: int, err_log: int) -> tuple[int, int]:
        """Take a task's two log descriptors; return the write ends its stdout and stderr
        get (the caller closes them once the task has them)."""
        ends = []
        for log, stream in ((out_log, self.out), (err_log, self.err)):
            read, write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            os.set_blocking(write, True)  # the task's side blocks as a file write would
            self.pipes.append(_Pipe(read, os.dup(log), f"{tag}\t".encode(), stream))
            ends.append(write)
        return ends[0], ends[1]

    def fds(self) -> list[int]:
        """What the wait loop wakes on."""
        return [p.fd for p in self.pipes]

    def pump(self) -> None:
        """Copy what the pipes hold; close those whose task side is closed."""
        for pipe in list(self.pipes):
            while True:
                try:
                    data = os.read(pipe.fd, CHUNK)
                except BlockingIOError:
                    break
                if not data:
                    self._close(pipe)
                    break
                _write_all(pipe.log, data)
                self._lines(pipe, data)

    def close(self, timeout: float) -> None:
        """Read until every task side is closed, at most ``timeout`` seconds; then close."""
        deadline = time.monotonic() + timeout
        while self.pipes and time.monotonic() < deadline:
            poller = select.poll()
            for fd in self.fds():
                poller.register(fd, select.POLLIN)
            poller.poll(max(0.0, deadline - time.monotonic()) * 1000)
            self.pump()
        for pipe in list(self.pipes):
            self._close(pipe)

    def _lines(self, pipe: _Pipe, data: bytes) -> None:
        *whole, pipe.partial = (pipe.partial + data).split(b"\n")
        if len(pipe.partial) >= LINE_LIMIT:
            whole.append(pipe.partial)
            pipe.partial = b""
        self._emit(pipe, whole)

    def _emit(self, pipe: _Pipe, lines: list[bytes]) -> None:
        if not lines or pipe.stream is None:
            return
        try:
            fd = _fileno(pipe.stream)
            if fd is None:  # not a file (a test's StringIO)
                text = b"".join(pipe.tag + line + b"\n" for line in lines)
                pipe.stream.write(text.decode(errors="replace"))
                return
            pipe.stream.flush()  # what was written through the stream goes first
            for index, line in enumerate(lines):
                if not _writable(fd):  # its reader does not keep up: never wait on it
                    self.dropped += len(lines) - index
                    return
                _write_all(fd, pipe.tag + line + b"\n")
        except (OSError, ValueError):  # its reader gone: the logs still get everything
            for other in self.pipes:
                if other.stream is pipe.stream:
                    other.stream = None

    def _close(self, pipe: _Pipe) -> None:
        if pipe.partial:
            self._emit(pipe, [pipe.partial])
            pipe.partial = b""
        os.close(pipe.fd)
        os.close(pipe.log)
        self.pipes.remove(pipe)


def _write_all(fd: int, data: bytes) -> None:
    """A log file's write; a full disk loses the rest of this chunk, never the farm."""
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass


def _fileno(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError, AttributeError):
        return None


def _writable(fd: int) -> bool:
    """Whether ``fd`` takes a line now: a file always does; a full pipe or a stopped terminal
    does not (a pipe with room takes PIPE_BUF bytes without waiting)."""
    return bool(select.select([], [fd], [], 0)[1])
