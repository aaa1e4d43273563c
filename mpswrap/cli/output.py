"""mpswrap's own standard output, as ``main()`` holds it while a command runs: a write to it
that fails (a full disk, ``> /dev/full``, an I/O error) is one error of its own, told apart
from an OSError of the command's own work; a reader that left (a closed pipe) ends quietly,
as a program a shell pipe ends."""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import MpswrapError

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any, TextIO

__all__ = ["Closed", "Output", "OutputError", "discard", "to_stderr"]


class OutputError(MpswrapError):
    """Standard output could not be written (exit 1, as coreutils' ``write error``). Not an
    OSError: no ``except OSError`` of a command mistakes it for a failure of its own work."""


class Output:
    """``stream`` (standard output) whose write and flush raise OutputError when writing
    fails; BrokenPipeError passes (``main()`` ends quietly on it). Anything else, as
    ``stream``."""

    def __init__(self, stream: TextIO | Closed) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        with _translated():
            return self._stream.write(text)

    def flush(self) -> None:
        with _translated():
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def _translated() -> Iterator[None]:
    """An OSError other than BrokenPipeError as OutputError, its cause kept."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputError("cannot write output", cause=exc.strerror or str(exc)) from exc


class Closed:
    """Standard output where the process started with none (``>&-``): every write fails, as
    it would on the closed descriptor; nothing to flush."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))


def to_stderr(line: str) -> None:
    """``line`` on standard error, where it can be written: a reader that left, or an error
    stream closed from the start, loses it, and the exit code still says what happened."""
    try:
        print(line, file=sys.stderr or Closed(), flush=True)
    except (OSError, ValueError):
        pass


def discard() -> None:
    """Standard output goes to /dev/null from here on: what is still buffered for it is
    dropped, so that the interpreter's flush at exit raises no second time (Python's signal
    docs, Note on SIGPIPE)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # none to start with (``Closed``): nothing is buffered
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def closed() -> int:
    """Standard output's reader left (``mpswrap config | head -1``): no message, exit
    128+SIGPIPE as a program a shell pipe ends."""
    discard()
    return 128 + signal.SIGPIPE
