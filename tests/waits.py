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

__all__ = ["sh_wait_for_records", "wait_until"]

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


def sh_wait_for_records(rec: Path, event: str, count: int, timeout: float = 60) -> str:
    """Shell: wait until ``rec`` (mps-sim-client --record) holds ``count`` records of
    ``event``; after ``timeout`` seconds say so on stderr and exit 124. A rank's script that
    must end only once the other ranks are clients runs this first."""
    has = shlex.quote(f'"event": "{event}"')
    said = shlex.quote(
        f"timed out after {timeout:g} s waiting for {count} {event} records in {rec}"
    )
    return (
        f'i=0; until [ "$(cat {shlex.quote(str(rec))} 2>/dev/null | grep -c {has})" -ge {count} ]; '
        f'do i=$((i + 1)); if [ "$i" -gt {int(timeout / SH_STEP)} ]; then echo {said} >&2; '
        f"exit 124; fi; sleep {SH_STEP}; done; "
    )
