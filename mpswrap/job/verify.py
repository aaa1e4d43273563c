"""Is a rank an MPS client? CUDA runs a program that misses its daemon without MPS, silently:
this is the check, polled from the wait loop with bounded backoff.

Modes (``--verify-attach``, the ``verify_attach`` setting): ``warn`` (the default) logs one
line naming the rank, its GPU's pipe directory and what to check; ``fail`` ends the ranks
(exit 69); ``off`` checks nothing. A rank still running but not listed when the timeout runs
out is warned about or failed; one that exits before it was ever listed is not. Once the ranks
have ended, such a rank is looked up in its daemon's control.log (``NEW CLIENT <pid>``, each
log read once, ``seen_in_logs``): a short program that connected between two listings counts
as attached; one that never started CUDA is "not seen" in the summary. (A PID the kernel gave
an earlier client of the same daemon would count too: PIDs wrap only after ``pid_max``.)

Cost: the real daemon serves control commands one at a time, and a GPU may have 48 ranks,
each polling. So each check backs off to one listing a second, stops once its rank is listed
(or gone), and the checks of one supervisor (``mpswrap run``) share one listing per daemon.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence

from .. import _proc
from ..errors import ControlError, MpswrapError
from ..mps.daemon import Daemon

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Protocol

    class Watched(Protocol):
        """What the check needs of a rank (``supervise.Rank``)."""

        name: str
        ident: _proc.ProcId
        daemon: Daemon | None

        def running(self) -> bool: ...

        def tree(
            self, table: Mapping[int, list[_proc.ProcId]] | None = None
        ) -> list[_proc.ProcId]: ...


__all__ = ["Verifier", "seen_in_logs"]

log = logging.getLogger(__name__)

#: First poll after this long, doubling up to MAX_DELAY between polls.
FIRST_DELAY, MAX_DELAY = 0.02, 1.0
#: A listing this fresh answers every check of this process (one wake of the wait loop).
LISTING_FRESH = 0.05


class Listings:
    """The clients of each daemon, listed at most once per wake for every check that asks."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, set[int]]] = {}
        self._table: tuple[float, dict[int, list[_proc.ProcId]]] | None = None

    def tree(self, rank: Watched, fresh: bool = False) -> set[int]:
        """The PIDs of ``rank``'s tree, from a reading of the process table that serves every
        check of one wake (a reading for each check took 0.15 s each with 1,700 processes on
        two CPUs: 48 ranks' checks held the wait loop for seconds); ``fresh`` reads it again."""
        if fresh or self._table is None or time.monotonic() - self._table[0] >= LISTING_FRESH:
            self._table = (time.monotonic(), _proc.process_table())
        found = _proc.descendants([rank.ident.pid], self._table[1])
        return {p.pid for p in rank.tree(found)}

    def clients(self, daemon: Daemon, fresh: bool = False) -> set[int]:
        key, now = str(daemon.dirs.pipe), time.monotonic()
        cached = self._seen.get(key)
        if cached and not fresh and now - cached[0] < LISTING_FRESH:
            return cached[1]
        try:
            pids = {pid for pids in daemon.control.clients().values() for pid in pids}
        except ControlError as exc:
            log.debug("verify: %s", exc.line())
            pids = set()
        self._seen[key] = (time.monotonic(), pids)
        return pids


class Verifier:
    """Polls the daemon's client list until the rank (or a descendant) is listed; bounded."""

    def __init__(
        self,
        rank: Watched,
        daemon: Daemon,
        timeout: float,
        mode: str,
        listings: Listings | None = None,
    ) -> None:
        self.rank, self.daemon, self.timeout, self.mode = rank, daemon, timeout, mode
        self.listings = listings or Listings()
        self.start = time.monotonic()
        self.next_at = self.start + FIRST_DELAY
        self.delay = FIRST_DELAY
        self.done = False
        #: Whether the rank was seen listed: the summary's "attached" (False until it was).
        self.listed = False
        #: The rank was ended because it is no client (``fail``).
        self.refused = False
        #: Every PID of the rank's tree a poll saw: what its daemon's log may name.
        self.pids = {rank.ident.pid}

    @classmethod
    def for_ranks(
        cls, ranks: Sequence[Watched], mode: str | None, timeout: float
    ) -> list[Verifier]:
        """A check per rank that has a daemon; none when ``mode`` is ``off`` (or None)."""
        if mode in (None, "off"):
            return []
        listings = Listings()
        return [cls(r, r.daemon, timeout, str(mode), listings) for r in ranks if r.daemon]

    def due_in(self) -> float:
        return max(0.0, self.next_at - time.monotonic())

    def failed(self) -> bool:
        """One poll when due: True when the rank must be ended (``fail`` and time is up)."""
        if self.done or self.due_in():
            return False
        if not self.rank.running():  # gone before it was listed: nothing to warn about
            self.done = True
            return False
        # The last word, once time is up, is a fresh look: a child started since the wake's
        # shared reading (up to LISTING_FRESH old), already listed by its daemon, is a client.
        if self._listed() or self._later() or self._listed(fresh=True):
            return False
        self.done = True
        if self.mode == "fail":
            self.refused = True
            print(self.error().render(), file=sys.stderr, flush=True)
            return True
        log.warning("%s; hint: %s", self.error().line(), self.error().hint)
        return False

    def _later(self) -> bool:
        """Whether the rank still has time: then the next poll is set, backing off."""
        if time.monotonic() - self.start >= self.timeout:
            return False
        self.next_at = time.monotonic() + self.delay
        self.delay = min(self.delay * 2, MAX_DELAY)
        return True

    def _listed(self, fresh: bool = False) -> bool:
        """Whether the daemon lists the rank or a descendant (then this check is done)."""
        tree = self.listings.tree(self.rank, fresh)
        self.pids |= tree
        if self.listings.clients(self.daemon, fresh) & tree:
            self.done = self.listed = True
        return self.listed

    def error(self) -> MpswrapError:
        return MpswrapError(
            f"{self.rank.name} is not an MPS client",
            thing=f"pid {self.rank.ident.pid}, pipe {self.daemon.dirs.pipe}",
            cause=f"not among the daemon's clients after {self.timeout:g} s",
            hint="it runs without MPS: does it (or a wrapper script) set "
            "CUDA_MPS_PIPE_DIRECTORY? raise --verify-timeout if CUDA starts late",
        )


def seen_in_logs(checks: Sequence[Verifier]) -> None:
    """After the ranks ended: a rank never listed, but that its daemon's control.log says
    connected, was a client all the same (it came and went between two listings). Each
    daemon's log is read once, only where some rank was not seen (``mpslog``'s bounds)."""
    from ..mps.mpslog import MpsLog  # not on a rank's start path (test_import_rules)

    connected: dict[str, set[int]] = {}
    for check in (c for c in checks if not c.listed and not c.refused):
        key = str(check.daemon.dirs.pipe)
        if key not in connected:
            connected[key] = set(MpsLog.read(check.daemon.dirs.control_log).clients_seen())
        check.listed = bool(connected[key] & check.pids)
