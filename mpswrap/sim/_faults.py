"""Fault injection: a JSON file named by ``MPSWRAP_SIM_FAULTS``, re-read at every use.

Re-reading lets a test change the daemon's behaviour while it runs. A missing or unreadable
file means no faults: a simulator that crashed on a half-written file would test nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The real limit on Volta and later up to CUDA 13.0 (seen: 48 on an H100, driver 580).
CLIENT_LIMIT = 48


@dataclass(frozen=True)
class Faults:
    start: str = ""
    hang: frozenset[str] = field(default_factory=frozenset)
    die_on: frozenset[str] = field(default_factory=frozenset)
    client_limit: int = CLIENT_LIMIT
    #: Like the real daemon, run on after the pipe directory is deleted (the simulator's own
    #: safety net, off here, otherwise ends it within a second).
    outlive_pipe_dir: bool = False

    def hangs(self, command: str) -> bool:
        return "*" in self.hang or command in self.hang

    def dies_on(self, command: str) -> bool:
        return "*" in self.die_on or command in self.die_on

    def slow_seconds(self) -> float:
        """Seconds of ``"start": "slow:<s>"``, else 0."""
        if not self.start.startswith("slow:"):
            return 0.0
        try:
            return max(0.0, float(self.start.split(":", 1)[1]))
        except ValueError:
            return 0.0


def _names(value: Any) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset([value])
    if isinstance(value, list):
        return frozenset(str(v) for v in value)
    return frozenset()


def load(path: str | None) -> Faults:
    if not path:
        return Faults()
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return Faults()
    if not isinstance(data, dict):
        return Faults()
    try:
        limit = int(data.get("client_limit", CLIENT_LIMIT))
    except (TypeError, ValueError):
        limit = CLIENT_LIMIT
    return Faults(
        start=str(data.get("start", "")),
        hang=_names(data.get("hang")),
        die_on=_names(data.get("die_on")),
        client_limit=limit,
        outlive_pipe_dir=data.get("outlive_pipe_dir") is True,
    )
