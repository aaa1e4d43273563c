"""Fault injection and timing: a JSON file named by ``MPSWRAP_SIM_FAULTS``, re-read at every use.

Re-reading lets a test change the daemon's behaviour while it runs. A missing or unreadable
file means the defaults, which are the real driver's behaviour (docs/concepts.md, "The
simulator against the real driver"): a simulator that crashed on a half-written file would
test nothing.
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
    #: Commands on which the daemon execs another program in its own process (``sleep``).
    become_on: frozenset[str] = field(default_factory=frozenset)
    client_limit: int = CLIENT_LIMIT
    #: Seconds before terminate_client answers ``0``. The client is told at once and exits at
    #: its own pace (the real daemon answered in ~11 ms with the client still alive).
    terminate_reply: float = 0.02
    #: Seconds a client goes on after its CUDA call failed (terminated, fault, forced quit)
    #: before it exits: host work between CUDA calls. ``--linger`` of a client overrides it.
    client_linger: float = 0.1
    #: Seconds between quit's answer and the servers' exit (~80 ms on an H100).
    quit_lag: float = 0.08
    #: The simulator's own safety net, off unless a test asks: daemon and servers exit within
    #: a second once their pipe directory is deleted, orphaned servers after ten minutes. The
    #: real ones run on, and so does the simulator by default.
    self_clean: bool = False

    def hangs(self, command: str) -> bool:
        return "*" in self.hang or command in self.hang

    def dies_on(self, command: str) -> bool:
        return "*" in self.die_on or command in self.die_on

    def becomes_on(self, command: str) -> bool:
        return "*" in self.become_on or command in self.become_on

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
    defaults = Faults()
    return Faults(
        start=str(data.get("start", "")),
        hang=_names(data.get("hang")),
        die_on=_names(data.get("die_on")),
        become_on=_names(data.get("become_on")),
        client_limit=int(_number(data.get("client_limit"), defaults.client_limit)),
        terminate_reply=_number(data.get("terminate_reply"), defaults.terminate_reply),
        client_linger=_number(data.get("client_linger"), defaults.client_linger),
        quit_lag=_number(data.get("quit_lag"), defaults.quit_lag),
        self_clean=data.get("self_clean") is True,
    )


def _number(value: Any, default: float) -> float:
    """A non-negative number from the file, else the default."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return default
    return float(value)
