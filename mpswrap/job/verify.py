"""Is a rank an MPS client? CUDA runs a program that misses its daemon without MPS, silently:
this is the check, polled from the wait loop with bounded backoff."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import Protocol

from .. import _proc
from ..errors import ControlError, MpswrapError
from ..mps.daemon import Daemon

__all__ = ["Verifier"]

log = logging.getLogger(__name__)


class Watched(Protocol):
    """What the check needs of a rank (``supervise.Rank``)."""

    name: str
    ident: _proc.ProcId
    daemon: Daemon | None

    def running(self) -> bool: ...

    def tree(self) -> list[_proc.ProcId]: ...


class Verifier:
    """Polls the daemon's client list until the rank (or a descendant) is listed; bounded."""

    def __init__(self, rank: Watched, daemon: Daemon, timeout: float, mode: str) -> None:
        self.rank, self.daemon, self.timeout, self.mode = rank, daemon, timeout, mode
        self.start = self.next_at = time.monotonic()
        self.delay = 0.02
        self.done = False

    @classmethod
    def for_ranks(
        cls, ranks: Sequence[Watched], mode: str | None, timeout: float
    ) -> list[Verifier]:
        return [cls(r, r.daemon, timeout, mode) for r in ranks if mode and r.daemon]

    def due_in(self) -> float:
        return max(0.0, self.next_at - time.monotonic())

    def failed(self) -> bool:
        """One poll when due: True when the rank must be ended (``fail`` and time is up)."""
        if self.done or self.due_in() or not self.rank.running():
            self.done = self.done or not self.rank.running()
            return False
        if self._listed():
            self.done = True
            return False
        if time.monotonic() - self.start < self.timeout:
            self.next_at = time.monotonic() + self.delay
            self.delay = min(self.delay * 2, 0.5)
            return False
        self.done = True
        if self.mode == "fail":
            print(self.error().render(), file=sys.stderr, flush=True)
            return True
        log.warning("%s", self.error().line())
        return False

    def _listed(self) -> bool:
        pids = {p.pid for p in self.rank.tree()}
        try:
            return self.daemon.control.has_client(pids) is not None
        except ControlError as exc:
            log.debug("verify: %s", exc.line())
            return False

    def error(self) -> MpswrapError:
        return MpswrapError(
            f"{self.rank.name} is not an MPS client",
            thing=f"pid {self.rank.ident.pid}, pipe {self.daemon.dirs.pipe}",
            cause=f"not among the daemon's clients after {self.timeout:g} s",
            hint="the program runs without MPS: does it (or a wrapper script) set "
            "CUDA_MPS_PIPE_DIRECTORY? raise --verify-timeout if CUDA starts late",
        )
