"""The end-of-run summary: one line per node saying what happened to its ranks.

``mpswrap: summary: node NODE: R ranks, A attached, exit codes CODES, T ended by
terminate_client, teardown TEARDOWN, S s`` (one line, on stderr; silenced by ``-qq``).

``mpswrap run`` knows every rank of its node and prints the line itself. In per-rank mode
(``srun mpswrap ./app``, ``mpirun -np 4 mpswrap ./app``, and so the prefix mode) each rank is
a supervisor process of its own: a rank that is not the last to leave its node writes its
``Outcome`` to a record in the job's directory there (``state.outcomes_dir``: the job user's,
in prolog and user mode alike), and the last one, decided under the job's owner lock
(``job.leave``), collects and removes the records and prints the line. "Last" means no other
rank of the node holds the job's daemons at that moment: ranks of one node that do not overlap
in time (one ends before the next starts) each print a summary of their own.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import LayoutError
from ..paths import JobLayout, ensure_private_dir, list_dir, read_job_file, write_job_file
from ..removal import remove_tree
from . import state

__all__ = ["BY_EPILOG", "NodeSummary", "Outcome", "collect", "emit", "save", "teardown_words"]

log = logging.getLogger(__name__)

#: The teardown of the prolog's daemons: not the ranks' to do.
BY_EPILOG = "by the epilog"
#: A record is a short JSON list; anything larger was not written by a rank.
RECORD_LIMIT = 64 * 1024
_RECORD = re.compile(r"^[0-9]+-[0-9a-f]{8}\.json$")


@dataclass(frozen=True)
class Outcome:
    """How one rank ended."""

    code: int  # shell style: 128+N after signal N
    attached: bool | None  # listed as a client of its daemon; None: not checked
    ended: int = 0  # its clients ended by terminate_client (its own ladder)
    start: float = 0.0  # when its supervisor started (epoch seconds)

    @classmethod
    def from_json(cls, data: Any) -> Outcome:
        """An outcome from a record; ValueError if the record is not one."""
        if not isinstance(data, dict):
            raise ValueError("not an object")
        code, attached = data.get("code"), data.get("attached")
        ended, start = data.get("ended", 0), data.get("start", 0.0)
        if not isinstance(code, int) or not isinstance(ended, int):
            raise ValueError("code and ended must be integers")
        if attached is not None and not isinstance(attached, bool):
            raise ValueError("attached must be true, false or null")
        if not isinstance(start, (int, float)) or isinstance(start, bool):
            raise ValueError("start must be a number")
        return cls(code, attached, ended, float(start))


def teardown_words(left: int) -> str:
    """``clean``, or ``left N behind`` (each problem is logged as an error already)."""
    return "clean" if not left else f"left {left} behind"


@dataclass(frozen=True)
class NodeSummary:
    """The summary of one node's ranks."""

    node: str
    outcomes: Sequence[Outcome]
    teardown: str  # teardown_words(), BY_EPILOG, or why there was none
    ended_by_teardown: int = 0  # clients the final teardown ended by terminate_client

    def line(self, now: float | None = None) -> str:
        outs = self.outcomes
        now = time.time() if now is None else now
        first = min((o.start for o in outs if o.start), default=now)
        ended = sum(o.ended for o in outs) + self.ended_by_teardown
        return (
            f"mpswrap: summary: node {self.node}: {len(outs)} rank{'s' * (len(outs) != 1)}, "
            f"{_attached(outs)}, exit codes {_codes(outs)}, {ended} ended by "
            f"terminate_client, teardown {self.teardown}, {max(0.0, now - first):.2f} s"
        )


def _attached(outcomes: Sequence[Outcome]) -> str:
    """``A attached``, with ``(U not seen)`` / ``(K not checked)`` where some were not."""
    checked = [o for o in outcomes if o.attached is not None]
    if not checked:
        return "attach not checked"
    seen = sum(1 for o in checked if o.attached)
    notes = [f"{len(checked) - seen} not seen"] if seen < len(checked) else []
    notes += [f"{len(outcomes) - len(checked)} not checked"] if len(checked) < len(outcomes) else []
    return f"{seen} attached" + (f" ({', '.join(notes)})" if notes else "")


def _codes(outcomes: Sequence[Outcome]) -> str:
    """``0`` when every rank agrees, else ``0 (3), 1 (1)``: code (how many), by code."""
    counts = Counter(o.code for o in outcomes)
    if len(counts) <= 1:
        return str(next(iter(counts), "none"))
    return ", ".join(f"{code} ({n})" for code, n in sorted(counts.items()))


def emit(summary: NodeSummary) -> None:
    """Print the line on stderr, unless the output is limited to errors (``-qq``)."""
    if logging.getLogger("mpswrap").isEnabledFor(logging.WARNING):
        print(summary.line(), file=sys.stderr, flush=True)


# --- the records of a node's ranks (called under the job's owner lock) ---------------------
def save(layout: JobLayout, outcomes: Sequence[Outcome]) -> None:
    """Leave ``outcomes`` for the node's last rank. Never fails the run: a record that cannot
    be written only makes the summary shorter (a warning says so)."""
    if not outcomes:
        return
    folder = state.outcomes_dir(layout)
    name = f"{os.getpid()}-{os.urandom(4).hex()}.json"
    text = json.dumps([asdict(o) for o in outcomes])
    try:
        ensure_private_dir(folder, os.getuid(), os.getgid())
        write_job_file(folder / name, text, os.getuid(), os.getgid(), mode=0o600)
    except (LayoutError, OSError) as exc:
        log.warning("summary: this rank's outcome not recorded (%s)", exc)


def collect(layout: JobLayout) -> list[Outcome]:
    """Every outcome other ranks left, their records removed (none is read twice, and
    nothing of them outlives the job). Records are read without following a symlink; one
    that is not a rank's is skipped with a warning."""
    folder = state.outcomes_dir(layout)
    try:
        names = list_dir(folder) or []
    except LayoutError as exc:
        log.warning("summary: %s", exc.line())
        return []
    found: list[Outcome] = []
    for name in sorted(n for n in names if _RECORD.fullmatch(n)):
        found += _read(folder / name)
    problem = remove_tree(folder) if names else None
    if problem:
        log.warning("summary: cannot remove %s", problem)
    return found


def _read(path: Path) -> list[Outcome]:
    text = read_job_file(path, RECORD_LIMIT)
    if text is None:
        return []
    try:
        data = json.loads(text)
        if not isinstance(data, list):
            raise ValueError("not a list")
        return [Outcome.from_json(item) for item in data]
    except (ValueError, OverflowError) as exc:
        log.warning("summary: skipping %s: not a rank's record (%s)", path, exc)
        return []
