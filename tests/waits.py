"""Bounded waits on a state: what a test does instead of sleeping "long enough".

The tests run in parallel (pytest-xdist) on loaded machines: a fixed sleep is too short there
and wasted everywhere else. A test waits for the very state it then checks, and a wait that
runs out fails naming what did not happen.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from mpswrap._wait import backoff

__all__ = ["sh_wait_for_file", "sh_wait_for_records", "sh_wait_until", "wait_until"]

T = TypeVar("T")

#: Seconds between two looks of a shell wait (a rank's script waiting for the others).
SH_STEP = 0.05


def wait_until(predicate: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``predicate`` (mpswrap's own backoff) until it returns something truthy, and
    return that; after ``timeout`` seconds fail the test, naming ``what`` it waited for."""
    for _ in backoff(timeout):
        value = predicate()
        if value:
            return value
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def sh_wait_until(condition: str, what: str, timeout: float = 60) -> str:
    """Shell: wait until the shell test ``condition`` holds; after ``timeout`` seconds say
    which ``what`` did not come on stderr and exit 124."""
    said = shlex.quote(f"timed out after {timeout:g} s waiting for {what}")
    return (
        f"i=0; until {condition}; do i=$((i + 1)); "
        f'if [ "$i" -gt {int(timeout / SH_STEP)} ]; then echo {said} >&2; exit 124; fi; '
        f"sleep {SH_STEP}; done; "
    )


def sh_wait_for_records(rec: Path, event: str, count: int, timeout: float = 60) -> str:
    """Shell: wait until ``rec`` (mps-sim-client --record) holds ``count`` records of
    ``event`` (else exit 124). A rank's script that must end only once the other ranks are
    clients runs this first."""
    has = shlex.quote(f'"event": "{event}"')
    count_them = f"$(cat {shlex.quote(str(rec))} 2>/dev/null | grep -c {has})"
    return sh_wait_until(
        f'[ "{count_them}" -ge {count} ]', f"{count} {event} records in {rec}", timeout
    )


def sh_wait_for_file(path: Path, timeout: float = 120) -> str:
    """Shell: wait until ``path`` exists (else exit 124). A job that must still run while
    the test looks at it waits for the file the test writes when it is done looking."""
    return sh_wait_until(f"[ -e {shlex.quote(str(path))} ]", str(path), timeout)
