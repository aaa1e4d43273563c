"""The run record: how each process a run started ended (``Outcome``), one per rank, task or
attempt, a program that could not be started (127, 126) included.

Every summary reads these and nothing else: the node's summary line (``report.summary``),
the farm's summary (``farm.view``) and what status shows. In per-rank mode each rank
is a supervisor of its own: a rank that is not the last to leave its node writes its outcomes
to a record in the job's directory (``state.outcomes_dir``: the job user's, in prolog and
user mode alike), and the last one, decided under the job's owner lock (``job.leave``),
collects and removes the records.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

from .. import _wait, fields
from .._struct import Struct, asdict
from ..errors import LayoutError
from ..paths import JobLayout, ensure_private_dir, list_dir, read_job_file, write_job_file
from ..removal import remove_tree
from . import state

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = ["Outcome", "collect", "peek", "save"]

log = logging.getLogger(__name__)

#: A record is a short JSON list; anything larger was not written by a rank.
RECORD_LIMIT = 64 * 1024
#: Records ``peek`` reads at most: one a rank of the node (a few hundred at most).
PEEK_LIMIT = 1024
_RECORD = re.compile(r"^[0-9]+-[0-9a-f]{8}\.json$")


#: The most clients one rank's ladder ends: more is no rank's record.
ENDED_MOST = 1 << 20


class Outcome(Struct, frozen=True):
    """How one rank ended."""

    code: int  # shell style: 128+N after signal N
    attached: bool | None  # listed as a client of its daemon; None: not checked
    ended: int = 0  # its clients ended by terminate_client (its own ladder)
    start: float = 0.0  # when its supervisor started (epoch seconds)
    refused: bool = False  # ended by --verify-attach fail: it ran without MPS

    @classmethod
    def from_json(cls, data: Any) -> Outcome:
        """An outcome from a record; ValueError if the record is not one."""
        if not isinstance(data, dict):
            raise ValueError("not an object")
        code, attached = data.get("code"), data.get("attached")
        ended, start = data.get("ended", 0), data.get("start", 0.0)
        if type(code) is not int or type(ended) is not int:  # true is no exit code
            raise ValueError("code and ended must be integers")
        if not 0 <= code <= 255 or not 0 <= ended <= ENDED_MOST:  # what status prints is bounded
            raise ValueError(f"code must be 0 to 255, ended 0 to {ENDED_MOST}")
        if attached is not None and not isinstance(attached, bool):
            raise ValueError("attached must be true, false or null")
        if not isinstance(start, (int, float)) or isinstance(start, bool):
            raise ValueError("start must be a number")
        refused = data.get("refused", False) is True
        return cls(code, attached, ended, float(start), refused)


# --- the records of a node's ranks (called under the job's owner lock) ---------------------
def save(layout: JobLayout, outcomes: Sequence[Outcome]) -> bool:
    """Leave ``outcomes`` for the node's last owner (and ``status``); whether they were
    written. Never fails the run: a record that cannot be written only makes the summary
    shorter (a warning says so)."""
    if not outcomes:
        return True
    folder = state.outcomes_dir(layout)
    name = f"{os.getpid()}-{os.urandom(4).hex()}.json"
    text = json.dumps([asdict(o) for o in outcomes])
    try:
        ensure_private_dir(folder, os.getuid(), os.getgid())
        write_job_file(folder / name, text, os.getuid(), os.getgid(), mode=0o600)
    except (LayoutError, OSError) as exc:
        log.warning("summary: this rank's outcome not recorded (%s)", exc)
        return False
    return True


def peek(layout: JobLayout, deadline: _wait.Deadline = _wait.NO_DEADLINE) -> list[Outcome]:
    """The outcomes recorded so far, left in place (``status`` reads them while the job
    runs): of ``PEEK_LIMIT`` records at most, none read past ``deadline``, quietly (the job
    user may make any number of them, root's ``status`` reads them); none where there is no
    record or it cannot be read."""
    return _records(layout, quiet=True, limit=PEEK_LIMIT, deadline=deadline)[1]


def collect(layout: JobLayout) -> list[Outcome]:
    """Every outcome other ranks left, their records removed (none is read twice, and
    nothing of them outlives the job). Records are read without following a symlink; one
    that is not a rank's is skipped with a warning."""
    names, found = _records(layout)
    problem = remove_tree(state.outcomes_dir(layout)) if names else None
    if problem:
        log.warning("summary: cannot remove %s", problem)
    return found


def _records(
    layout: JobLayout,
    quiet: bool = False,
    limit: int | None = None,
    deadline: _wait.Deadline = _wait.NO_DEADLINE,
) -> tuple[list[str], list[Outcome]]:
    """The names in the record folder, and the outcomes of those that are records (the first
    ``limit`` of them, as many as ``deadline`` leaves time for)."""
    folder = state.outcomes_dir(layout)
    try:
        names = list_dir(folder) or []
    except LayoutError as exc:
        if not quiet:
            log.warning("summary: %s", exc.line())
        return [], []
    found: list[Outcome] = []
    for name in sorted(n for n in names if _RECORD.fullmatch(n))[:limit]:
        if deadline.passed:
            break
        found += _read(folder / name, quiet)
    return names, found


def _read(path: Path, quiet: bool = False) -> list[Outcome]:
    text = read_job_file(path, RECORD_LIMIT)
    if text is None:
        return []
    try:
        data = fields.json_value(text)
        if not isinstance(data, list):
            raise ValueError("not a list")
        return [Outcome.from_json(item) for item in data]
    except (ValueError, OverflowError) as exc:
        if not quiet:
            log.warning("summary: skipping %s: not a rank's record (%s)", path, exc)
        return []
