"""Values of files someone else wrote, checked against the type their field declares.

A job user writes manifests, pid files, logs and run records; a control socket in their
directory answers with whatever its program prints. Each value is taken only in the form the
field declares: text of bounded length, a whole number in range written in ASCII digits (not
``²``, ``٣`` or 5,000 digits, which ``str.isdigit`` accepts), a finite number, a list of
bounded length. Anything else raises ``FieldError`` (a ``ValueError``), which the reader turns
into "ignore this file" (or this value), never into an internal error.
"""

from __future__ import annotations

import json
import math
import re

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = [
    "PID_MAX",
    "FieldError",
    "items",
    "json_value",
    "number",
    "pid",
    "pid_text",
    "text",
    "whole",
]

#: The kernel's largest pid_max (2^22).
PID_MAX = 1 << 22
_DIGITS = re.compile(r"[0-9]{1,10}", re.ASCII)


class FieldError(ValueError):
    """A value is not of its field's type."""


def text(value: object, limit: int = 4096) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise FieldError(f"expected text of at most {limit} characters, got {_kind(value)}")
    return value


def whole(value: object, most: int = (1 << 32) - 1) -> int:
    """A JSON whole number from 0 to ``most`` (not a bool, not a float)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most:
        raise FieldError(f"expected a whole number from 0 to {most}, got {_kind(value)}")
    return value


def number(value: object, most: float = 1e12) -> float:
    """A finite JSON number from 0 to ``most`` (a time, a share)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise FieldError(f"expected a number, got {_kind(value)}")
    if not (math.isfinite(value) and 0 <= value <= most):
        raise FieldError(f"expected a number from 0 to {most:g}, got {_kind(value)}")
    return float(value)


def pid(value: object) -> int:
    """A process ID: a whole number from 1 to ``PID_MAX``."""
    found = whole(value, PID_MAX)
    if found < 1:
        raise FieldError("expected a process ID, got 0")
    return found


def pid_text(word: str) -> int:
    """A process ID written as text (a pid file, a log line, a control reply): ASCII digits
    only, at most ``PID_MAX``."""
    if not _DIGITS.fullmatch(word):
        raise FieldError(f"expected a process ID, got {word[:20]!r}")
    return pid(int(word))


def items(value: object, limit: int = 4096) -> list[Any]:
    """A JSON list of at most ``limit`` items."""
    if not isinstance(value, list) or len(value) > limit:
        raise FieldError(f"expected a list of at most {limit} items, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    """The value as an error shows it: never all of a long one (``repr`` of an int of
    thousands of digits raises by itself)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a whole number of {value.bit_length()} bits"
    if isinstance(value, (str, bytes, list, dict)) and len(value) > 30:
        return f"{type(value).__name__} of length {len(value)}"
    return repr(value)


def json_value(text: str) -> Any:
    """The value of JSON someone else wrote (a manifest, a run record, a farm's journal line
    or profile), read from a size-capped file: a FieldError where it is not JSON, and where it
    nests past what Python's parser recurses through (``[`` * 20000: a RecursionError, which
    no caller expects) or holds a number past ``int``'s digits. The one parse of such text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FieldError(f"not JSON (line {exc.lineno} column {exc.colno})") from None
    except ValueError:  # a number of more digits than int takes
        raise FieldError("not JSON mpswrap reads: a number too long") from None
    except RecursionError:
        raise FieldError("not JSON mpswrap reads: nested too deep") from None
