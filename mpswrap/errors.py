"""One error tree for mpswrap.

Every error carries structured fields (what failed, on which thing, why) and renders as
``mpswrap: <context>: <what failed> (<thing>): <cause>`` plus an optional ``hint:`` line.
Errors are picklable so they cross process and MPI boundaries intact.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = [
    "EXIT_CODES",
    "CapacityError",
    "ConfigError",
    "ControlError",
    "DaemonError",
    "GpuChoiceError",
    "GpuError",
    "InventoryFileError",
    "LayoutError",
    "LineFormatter",
    "LockTimeout",
    "MpswrapError",
    "ProcError",
    "TrustError",
    "UsageError",
    "controls_escaped",
    "internal_error",
    "one_line",
    "shown",
]

#: Every exit code mpswrap itself chooses, and what it means (docs/reference.md shows this
#: table; tests/functional/test_cli_grammar.py produces each code). A program's own exit code
#: passes through unchanged in the launch modes.
EXIT_CODES: tuple[tuple[str, str], ...] = (
    ("0", "success; `status`: every daemon, server and client found is healthy"),
    (
        "1",
        "an operation failed (the message names what, which thing, and why); `stop` and the "
        "epilog: something survived the ladder",
    ),
    (
        "2",
        "usage or configuration error: unknown command or option, a bad value of an option, "
        "setting or variable (a GPU this node does not have, a request over a limit, a path "
        "that is no program, a directory that cannot be made or written), a command or option "
        "only root may use",
    ),
    ("3", "`status`: something found is not healthy (a daemon not running, a server in FAULT)"),
    ("4", "`status`: no mpswrap daemons found for the jobs asked about"),
    ("69", "`--verify-attach fail`: a rank did not become an MPS client"),
    (
        "126",
        "the program cannot be executed (not an executable file, no #! line, a #! "
        "interpreter that is not there, a loop of links, a folder it may not enter)",
    ),
    ("127", "the program was not found"),
    (
        "128+N",
        "the program was ended because of signal N (e.g. 143 for SIGTERM); 141 (SIGPIPE), "
        "quietly, also when mpswrap's own standard output was closed (`mpswrap config | head -1`)",
    ),
)

_BREAKS = re.compile(r"\s*[\r\n]+\s*")
#: Control characters other than line breaks (C0 but tab, DEL, C1), as ``\xNN``: no escape
#: sequence a job user put in a file or command line reaches a terminal or a log.
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(32), *range(127, 160)] if chr(c) not in "\t\r\n"}


def one_line(text: str) -> str:
    """``text`` with its line breaks as `` | `` and other control characters escaped: a
    message is one line in every log it reaches (slurmd's log, syslog, a drain reason), and
    no input can forge a second one or send a terminal an escape sequence."""
    return controls_escaped(_BREAKS.sub(" | ", text.strip()))


def controls_escaped(text: str) -> str:
    """``text`` with control characters other than line breaks and tabs as ``\\xNN``."""
    return text.translate(_CONTROLS)


class LineFormatter(logging.Formatter):
    """``<prefix>: <one line>`` for every log record of mpswrap (the hooks' and the command
    line's): each message goes through ``one_line``, so no text a job user wrote and a message
    carries reaches a terminal or a log raw. A debug record also says when (ms since the
    process started: where it waits), and its traceback, each line escaped, follows it."""

    def __init__(self, prefix: str, stamp_all: bool = False) -> None:
        super().__init__()
        self.prefix = prefix
        #: Every record says when (the command line at debug), not only debug records.
        self.stamp_all = stamp_all

    def format(self, record: logging.LogRecord) -> str:
        message = one_line(record.getMessage())
        if record.levelno <= logging.DEBUG or self.stamp_all:
            message = f"{record.relativeCreated:.0f} ms {message}"
        text = f"{self.prefix}: {message}"
        if record.exc_info and record.levelno <= logging.DEBUG:
            trace = self.formatException(record.exc_info).splitlines()
            text += "".join(f"\n{self.prefix}:   {one_line(line)}" for line in trace)
        return text


def shown(text: str, limit: int, spaces: bool = True) -> str:
    """Text someone else wrote, as a word to print or log: itself when printable and at most
    ``limit`` long (and, unless ``spaces``, without a blank), else the repr of its start: no
    control sequence or line break of theirs reaches a terminal or a log."""
    if text.isprintable() and len(text) <= limit and (spaces or " " not in text):
        return text
    return repr(text[:limit])


def internal_error(exc: BaseException, traceback_at: str) -> str:
    """The one line for an exception mpswrap did not expect; its traceback goes only to the
    debug log, which ``traceback_at`` names (``--debug``, ``log_level = debug``)."""
    message = one_line(str(exc)) or "(no message)"
    return f"internal error: {type(exc).__name__}: {message} (traceback {traceback_at})"


class MpswrapError(Exception):
    """Base class of every error mpswrap raises on purpose."""

    exit_code = 1

    def __init__(
        self,
        what: str,
        *,
        thing: str | None = None,
        cause: str | None = None,
        hint: str | None = None,
        context: str | None = None,
        **fields: Any,
    ) -> None:
        self.what = what
        self.thing = thing
        self.cause = cause
        self.hint = hint
        self.context = context
        self.fields = fields
        super().__init__(self.line())

    def line(self) -> str:
        """The one-line message, without the program name or hint."""
        text = self.what
        if self.thing:
            text += f" ({self.thing})"
        if self.cause:
            text += f": {self.cause}"
        if self.context:
            text = f"{self.context}: {text}"
        return one_line(text)

    def render(self) -> str:
        """Full message as the CLI prints it: program, context, thing, cause, hint."""
        text = f"mpswrap: {self.line()}"
        if self.hint:
            text += f"\nhint: {self.hint}"
        return text

    def with_context(self, context: str) -> MpswrapError:
        """Set the context (e.g. ``prolog``) if none was set; return self for raising."""
        if not self.context:
            self.context = context
            self.args = (self.line(),)
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        kwargs = dict(
            thing=self.thing, cause=self.cause, hint=self.hint, context=self.context, **self.fields
        )
        return (_rebuild, (type(self), self.what, kwargs))

    def __str__(self) -> str:
        return self.line()


def _rebuild(cls: type[MpswrapError], what: str, kwargs: dict[str, Any]) -> MpswrapError:
    return cls(what, **kwargs)


class UsageError(MpswrapError, ValueError):
    """Bad command-line usage (exit code 2)."""

    exit_code = 2


class ConfigError(MpswrapError, ValueError):
    """A setting is unknown or has a bad value."""

    exit_code = 2


class TrustError(ConfigError):
    """A file root would read or run can be changed by a user other than root."""


class LayoutError(MpswrapError, OSError):
    """A per-job path is unsafe, too long, or cannot be created."""


class LockTimeout(MpswrapError, TimeoutError):
    """A file lock another process holds was not released in time."""


class GpuError(MpswrapError, LookupError):
    """A GPU cannot be found or resolved."""


class GpuChoiceError(GpuError, UsageError):
    """A GPU list names a GPU this node does not have, or one twice: a bad value (exit 2)."""


class InventoryFileError(GpuError, ConfigError):
    """The file the ``gpu_inventory`` setting names cannot be read or is no inventory: a bad
    value of a setting (exit 2), as a missing admin file is; the hooks keep their contract."""

    exit_code = 2


class ProcError(MpswrapError, OSError):
    """An external command failed, timed out, or could not be started."""

    @property
    def argv(self) -> Sequence[str]:
        return tuple(self.fields.get("argv", ()))

    @property
    def returncode(self) -> int | None:
        return self.fields.get("returncode")

    @property
    def stderr(self) -> str:
        return str(self.fields.get("stderr", ""))


class ControlError(MpswrapError, RuntimeError):
    """The MPS control daemon refused or failed a command."""


class DaemonError(MpswrapError, RuntimeError):
    """A per-GPU MPS daemon could not be started, found, or stopped."""


class CapacityError(MpswrapError, RuntimeError):
    """More clients were asked for than a GPU's MPS server accepts: a request over a limit."""

    exit_code = 2
