"""The end-of-run summary: one line per node saying what happened to its ranks.

``mpswrap: summary: node NODE: R ranks, A attached, exit codes CODES, T ended by
terminate_client, teardown TEARDOWN, S s`` (one line, on stderr; silenced by ``-qq``).

It is made from the run record (``job.outcomes``) that the node's last owner collected
(``job.leave``): ``mpswrap run`` knows every rank of its node; in per-rank mode (``srun
mpswrap ./app``, ``mpirun -np 4 mpswrap ./app``) the last rank to leave its node prints it.
"Last" means no other rank of the node holds the job's daemons at that moment: ranks of one
node that do not overlap in time each print a summary of their own.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence

from .._struct import Struct
from ..job.job import Released
from ..job.outcomes import Outcome

__all__ = [
    "BY_EPILOG",
    "NodeSummary",
    "codes_words",
    "emit",
    "node_summary",
    "print_summary",
    "teardown_words",
]

#: The teardown of the prolog's daemons: not the ranks' to do.
BY_EPILOG = "by the epilog"


def teardown_words(left: int) -> str:
    """``clean``, or ``left N behind`` (each problem is logged as an error already)."""
    return "clean" if not left else f"left {left} behind"


class NodeSummary(Struct, frozen=True):
    """The summary of one node's ranks."""

    node: str
    outcomes: Sequence[Outcome]
    teardown: str  # teardown_words(), BY_EPILOG, or why there was none
    ended_by_teardown: int = 0  # clients the final teardown ended by terminate_client
    #: What the outcomes are: a launch's ranks, or a farm's tasks (its attempts).
    noun: str = "rank"

    def line(self, now: float | None = None) -> str:
        outs = self.outcomes
        now = time.time() if now is None else now
        first = min((o.start for o in outs if o.start), default=now)
        ended = sum(o.ended for o in outs) + self.ended_by_teardown
        return (
            f"mpswrap: summary: node {self.node}: {len(outs)} {self.noun}{'s' * (len(outs) != 1)}, "
            f"{_attached(outs, self.noun)}, exit codes {_codes(outs)}, {ended} ended by "
            f"terminate_client, teardown {self.teardown}, {max(0.0, now - first):.2f} s"
        )


def _attached(outcomes: Sequence[Outcome], noun: str = "rank") -> str:
    """``A attached``, with ``(U not seen)`` / ``(K not checked)`` where some were not. A
    farm's task that ended before a check saw it (no CUDA, or too short to be listed) is no
    alarm: ``(K ended before a check)``."""
    checked = [o for o in outcomes if o.attached is not None]
    unchecked = len(outcomes) - len(checked)
    if not checked and noun != "task":
        return "attach not checked"
    seen = sum(1 for o in checked if o.attached)
    notes = [f"{len(checked) - seen} not seen"] if seen < len(checked) else []
    if unchecked:
        notes.append(
            f"{unchecked} ended before a check" if noun == "task" else f"{unchecked} not checked"
        )
    return f"{seen} attached" + (f" ({', '.join(notes)})" if notes else "")


def _codes(outcomes: Sequence[Outcome]) -> str:
    return codes_words(Counter(o.code for o in outcomes))


def codes_words(counts: Mapping[int, int]) -> str:
    """``0`` when every rank agrees, else ``0 (3), 1 (1)``: code (how many), by code."""
    if len(counts) <= 1:
        return str(next(iter(counts), "none"))
    return ", ".join(f"{code} ({n})" for code, n in sorted(counts.items()))


def emit(summary: NodeSummary) -> None:
    """Print the line on stderr, unless the output is limited to errors (``-qq``)."""
    if logging.getLogger("mpswrap").isEnabledFor(logging.WARNING):
        print(summary.line(), file=sys.stderr, flush=True)


def node_summary(
    done: Released, outcomes: Sequence[Outcome] | None = None, noun: str = "rank"
) -> NodeSummary | None:
    """The node's summary, from the last owner to leave; else None. ``outcomes``: the
    caller's record of what ran (a farm's journal), instead of the run record's."""
    if done.outcomes is None:
        return None
    teardown = done.teardown
    if done.att.mode != "user":
        words = BY_EPILOG
    elif teardown is None:  # its directory went first (a tmp cleaner): the watchdog ends them
        words = "not run (job directory gone)"
    else:
        words = teardown_words(len(teardown.problems()))
    ended = sum(len(r.terminated) for r in teardown.gpus) if teardown else 0
    outs = done.outcomes if outcomes is None else outcomes
    return NodeSummary(done.att.layout.node, outs, words, ended, noun)


def print_summary(done: Released) -> None:
    """The node's summary line, from its last owner, where some program ran (``emit``)."""
    node = node_summary(done)
    if node is not None and node.outcomes:
        emit(node)
