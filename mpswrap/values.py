"""The text forms of setting values: each parser turns an admin's text (a line of the admin
file, an ``MPSWRAP_*`` variable, an option) into a typed value, or raises ValueError saying
which form it expected. ``config.FIELDS`` pairs each setting with one of these."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Literal

__all__ = [
    "HOUR",
    "MOST",
    "WEEK",
    "YEAR",
    "Parser",
    "abs_path",
    "boolean",
    "cgroup_root",
    "choice",
    "clients",
    "counts",
    "grace",
    "inventory",
    "mem_default",
    "mem_limit",
    "mem_size",
    "optional",
    "percent",
    "priority",
    "program",
    "seconds",
    "share_percent",
    "threads",
    "triggers",
    "weights",
    "whole",
    "within",
]

#: Turns admin text into a value of its setting's attribute type (``Settings`` declares it).
Parser = Callable[[str], object]


def choice(*choices: str) -> Parser:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return text

    return parse


def boolean(text: str) -> bool:
    low = text.lower()
    if low in ("1", "yes", "true", "on"):
        return True
    if low in ("0", "no", "false", "off"):
        return False
    raise ValueError("expected yes or no")


#: The most a count may be: six digits, as a plain decimal has.
MOST = 999999
#: The most seconds an option may be (a task's --timeout, a --heartbeat): a week.
WEEK = 7 * 24 * 3600
#: The most seconds an option takes (``--timeout``: a task of a job that may run for months).
YEAR = 366 * 24 * 3600


def _number(text: str, error: str) -> float:
    """A plain decimal (``15``, ``2.5``, a script's ``1.4000000000000001``) in ASCII digits:
    not ``nan``, ``inf``, ``1e3``, ``1_0`` nor Arabic-Indic digits."""
    if not re.fullmatch(r"[0-9]{1,6}(\.[0-9]{1,17})?", text):
        raise ValueError(error)
    return float(text)


def whole(text: str, least: int, most: int = MOST) -> int:
    """A whole number from ``least`` to ``most``, in ASCII digits only (not Arabic-Indic ones,
    ``+1``, ``1_0`` nor ``1e3``)."""
    if not re.fullmatch(r"[0-9]{1,6}", text) or not least <= int(text) <= most:
        raise ValueError(f"expected a whole number from {least} to {most}")
    return int(text)


def within(text: str, least: float, most: float, unit: str, *, above: bool = True) -> float:
    """A plain decimal above ``least`` (or at least it, ``above=False``) and at most ``most``."""
    lower = f"above {least:.10g} and at most" if above else f"from {least:.10g} to"
    error = f"expected {unit} {lower} {most:.10g}"  # 31622400, not 3.16224e+07
    value = _number(text, error)
    if value < least or (above and value == least) or value > most:
        raise ValueError(error)
    return value


#: The most seconds a setting's wait or grace may be.
HOUR = 3600


def seconds(text: str) -> float:
    return within(text, 0, HOUR, "seconds")


def grace(text: str) -> float:
    """Seconds from a signal to SIGKILL: 0 (at once) to an hour, the option as the setting."""
    return within(text, 0, HOUR, "seconds", above=False)


def days(text: str) -> float:
    return within(text, 0, 36500, "days")


def optional(parse: Parser) -> Parser:
    def wrapped(text: str) -> object:
        return None if text.lower() in ("", "none", "off") else parse(text)

    return wrapped


def percent(text: str) -> float:
    error = "expected a percentage in (0, 100]"
    value = _number(text, error)
    if not 0 < value <= 100:
        raise ValueError(error)
    return value


def clients(text: str) -> int | Literal["auto"]:
    if text == "auto":
        return "auto"
    error = "expected auto or a number of clients from 1 to 128"
    if not re.fullmatch(r"[0-9]{1,3}", text) or not 1 <= int(text) <= 128:
        raise ValueError(error)
    return int(text)


def per_gpu(text: str) -> int | None:
    """A farm's K: ``auto`` (None: found as the farm runs) or a whole number from 1 to
    ``MOST``."""
    if text == "auto":
        return None
    try:
        return whole(text, 1)
    except ValueError as exc:
        raise ValueError(f"expected auto or {str(exc).removeprefix('expected ')}") from None


def mem_size(text: str) -> str:
    digits, unit = text[:-1], text[-1:].upper()
    if unit not in ("M", "G") or not re.fullmatch(r"[0-9]{1,9}", digits) or int(digits) == 0:
        raise ValueError("expected a size like 512M or 2G")
    return f"{int(digits)}{unit}"


def mem_limit(text: str) -> str:
    """A client's pinned memory limit (the launch modes' ``--mem-limit``): ``auto`` (the GPU's
    memory over the ranks on it) or a size."""
    if text == "auto":
        return text
    try:
        return mem_size(text)
    except ValueError as exc:
        raise ValueError(f"expected auto or {str(exc).removeprefix('expected ')}") from None


def mem_default(text: str) -> str:
    """``start --mem-limit``: a size, or none (off) for no default limit, as the
    ``pinned_mem_limit`` setting reads it."""
    return text if text.lower() in ("none", "off") else mem_size(text)


def abs_path(text: str) -> str:
    if not os.path.isabs(text):
        raise ValueError("expected an absolute path")
    return os.path.normpath(text)


def inventory(text: str) -> str:
    return text if text == "nvml" else abs_path(text)


def cgroup_root(text: str) -> str:
    """``auto``, ``none``, or the absolute path of a folder in the cgroup2 file system."""
    return text if text in ("auto", "none") else abs_path(text)


def farm_profile(text: str) -> str:
    """``auto`` (the user's cache directory), ``off``, or the profile file's absolute path."""
    return text if text in ("auto", "off") else abs_path(text)


def program(text: str) -> str:
    """A program name looked up in a fixed PATH, or an absolute path (never a relative one:
    root runs it, from whatever directory)."""
    if os.path.isabs(text):
        return os.path.normpath(text)
    if not re.fullmatch(r"[A-Za-z0-9._+-]+", text):
        raise ValueError("expected a program name or an absolute path")
    return text


def triggers(text: str) -> tuple[str, ...]:
    items = tuple(t.strip() for t in text.split(",") if t.strip())
    for item in items:
        kind, _, name = item.partition(":")
        if item not in ("gres-mps", "spank") and (kind not in ("feature", "comment") or not name):
            raise ValueError("expected a list of gres-mps, spank, feature:<name>, comment:<word>")
    return items


#: A weight of ``--threads w1:w2:...``: a plain decimal (not ``1e308``, ``nan`` or ``inf``,
#: which would overflow the shares).
_WEIGHT = re.compile(r"[0-9]{1,6}(\.[0-9]{1,6})?", re.ASCII)


def weights(text: str) -> list[float]:
    """``w1:w2:...``: the clients of a GPU share it in these proportions, in turn."""
    words = text.split(":")
    if not all(_WEIGHT.fullmatch(w) and float(w) > 0 for w in words):
        raise ValueError("expected weights w1:w2:..., each a plain number above 0, at most 999999")
    return [float(w) for w in words]


def threads(text: str) -> str:
    """``--threads``: none, uniform, oversubscribe, a percentage or weights, checked and kept
    as given (a client's share depends on how many clients share its GPU)."""
    if text in ("none", "uniform", "oversubscribe"):
        return text
    if ":" in text:
        weights(text)
        return text
    try:
        percent(text)
    except ValueError:
        raise ValueError(
            "expected none, uniform, oversubscribe, a percentage in (0, 100] or weights w1:w2:..."
        ) from None
    return text


#: The most copies ``calibrate --counts`` tries at once: more than any GPU takes.
MOST_COPIES = 9999


def counts(text: str) -> list[int]:
    """``1,4,8,12``: whole numbers from 1 to ``MOST_COPIES``, sorted, each once."""
    words = text.split(",")
    if not all(re.fullmatch(r"[0-9]{1,4}", w) and int(w) >= 1 for w in words):
        raise ValueError(
            f"expected copies from 1 to {MOST_COPIES}, separated by commas, e.g. 1,4,8,12"
        )
    return sorted({int(w) for w in words})


def priority(text: str) -> int:
    if text not in ("0", "1"):
        raise ValueError("expected 0 (normal) or 1 (below normal)")
    return int(text)


def share_percent(value: float) -> float:
    """A client's share of a GPU as MPS takes it: in [1, 100], rounded down to a tenth so that
    the shares of one GPU never add up to more than 100 (6 x 16.7 = 100.2)."""
    return max(1.0, min(100.0, math.floor(value * 10 + 1e-9) / 10))
