"""A farm's task processes: started by the farm itself, each with its GPU's MPS environment, and
ended through ``terminate_client`` before any signal, with no Python process per task.

A task is ``/bin/sh -c LINE`` (checked once for the farm, not per task), started in the farm's
process group with its output to its log files and the tag ``MPSWRAP_TREE=<farm tag>-<task>-
<attempt>`` that all it starts inherits. The shield (``supervise``'s: Slurm signals every
process of a step at once, and the farm ends its clients through MPS first) is the shell's own
``trap '' TERM INT HUP`` before the line: ignored dispositions pass to everything the line runs,
as a ``preexec_fn`` would set them, but the spawn needs no Python code in the child, so it is a
``vfork`` (about 1 ms a task, against 2.5 ms; seen on the 2-CPU VM). The shell's own first
instants are unshielded: a signal then ends no MPS client (none has started). It is reaped with
``wait4`` (its CPU time: ``sizing``'s CPU-light test).

What a task leaves running when it exits becomes the farm's own child (the farm is a child
subreaper, ``_proc.adopt_orphans``): each wake after a task ended lists the farm's children,
and those that carry the farm's tag are ended as a step's are (terminate_client, SIGTERM,
SIGKILL). A container runtime that starts its container outside the process tree (Podman's
conmon) is swept by its tag, as ``supervise.end_leftovers`` does for any rank.

One guard for the whole farm (``_signals.fork_guard``), not one per task: should the farm be
killed outright, it finds the processes that carry the farm's tag and ends them through each
GPU's daemon, then by signal.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping, Sequence

from .. import _proc
from .._signals import FORWARDED, TERMINATING, Guard, fork_guard
from .._wait import end_procs, pidfd
from ..job.containers import runtime_of
from ..job.supervise import (
    Rank,
    check_program,
    deliver,
    end_leftovers,
    end_unshielded,
    spawn_rank,
)
from ..jobenv import ATTEMPT_VAR, TASK_VAR, TREE_VAR
from ..mps.daemon import Daemon
from .lanes import Attempt
from .tasks import Task

__all__ = ["TaskProcs"]

log = logging.getLogger(__name__)

#: What a shielded task's shell runs before its line: TERM, INT and HUP ignored, for it and all
#: it starts (the signals ``_proc.SHIELDED``).
SHIELD = "trap '' TERM INT HUP; "


class TaskProcs:
    """The farm's task processes: how they start, end and what they leave."""

    def __init__(self, daemons: Sequence[Daemon], *, shield: bool, grace: float) -> None:
        self.daemons, self.shield, self.grace = list(daemons), shield, grace
        self.tag = f"{os.getpid()}-farm-{os.urandom(4).hex()}"
        self.adopting = False
        self.guard: Guard | None = None

    def __enter__(self) -> TaskProcs:
        check_program(["/bin/sh"], os.environ)
        self.adopting = _proc.adopt_orphans()
        self.guard = fork_guard(self._orphaned, ignore=(*TERMINATING, *FORWARDED))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.guard is not None:
            self.guard.release()

    def spawn(
        self,
        task: Task,
        number: int,
        env: Mapping[str, str],
        daemon: Daemon | None,
        outputs: tuple[int, int],
    ) -> tuple[Rank, int | None]:
        """The task's process (OSError where it cannot start), and a descriptor that turns
        readable when it exits."""
        env = {**env, TASK_VAR: str(task.number), ATTEMPT_VAR: str(number)}
        argv = task.argv
        if self.shield:
            argv = [*argv[:2], f"{SHIELD}{argv[2]}"]
        rank = spawn_rank(
            argv,
            env,
            daemon,
            shield=self.shield,
            trapped=True,  # the shell's trap (above)
            name=f"task {task.number}",
            stdout=outputs[0],
            stderr=outputs[1],
            stdin=_proc.DEVNULL,
            tag=f"{self.tag}-{task.number}-{number}",
        )
        runtime = runtime_of(task.argv)  # the line as written, without the trap
        rank.detached = runtime is not None and runtime[0].detached
        return rank, pidfd(rank.proc.pid)

    @staticmethod
    def reap(attempt: Attempt) -> bool:
        """Whether the attempt's process exited (its code, signal and CPU time set)."""
        proc = attempt.rank.proc
        assert isinstance(proc, _proc.Popen)  # spawn_rank's
        reaped = _proc.reap(proc)
        if reaped is None:
            return False
        returncode, attempt.cpu = reaped
        attempt.code = attempt.rank.code(returncode)
        # The signal the code names: N, also where a SIGKILL stood in for N's default action.
        attempt.signal = attempt.code - 128 if returncode < 0 else 0
        if attempt.pidfd is not None:
            os.close(attempt.pidfd)
            attempt.pidfd = None
        return True

    def ended(self, gone: Sequence[Attempt], live: Sequence[Attempt]) -> None:
        """Once tasks ended (``gone``): what they left running is ended (the module's text);
        the ``live`` ones are the farm's children still."""
        if self.adopting:
            known = {a.rank.ident.pid for a in live} | {self.guard.pid if self.guard else 0}
            doomed = {pid for a in gone for pid in a.rank.doomed}
            self._sweep(_proc.own_children() - known, doomed)
        end_leftovers([a.rank for a in gone if a.rank.detached])

    def _sweep(self, children: set[int], doomed: set[int]) -> None:
        """End (and reap) what the tasks left; say so of all but the ``doomed``, processes a
        SIGKILL of the farm's own is ending already (``supervise.deliver``)."""
        left = _proc.tagged(children, TREE_VAR, self.tag)
        if not left:
            return
        procs = [p for p in map(_proc.identify, left) if p is not None]
        if any(p.pid not in doomed for p in procs):
            log.warning(
                "farm: tasks exited and left %s running: ending them",
                ", ".join(_proc.describe(p) for p in procs if p.pid not in doomed),
            )
        pids = {p.pid for p in procs} | {c.pid for p in procs for c in _proc.children_of(p.pid)}
        for daemon in self.daemons:
            daemon.end_clients(pids)
        adopted = [_proc.Adopted(pid) for pid in left]
        # A shielded leftover is killed at once: the farm's loop waits here, and a grace
        # for a process that ignores SIGTERM only held every other task's reaping up.
        for proc in end_unshielded(procs, self.grace, adopted):
            log.error("farm: still running after SIGKILL: %s", _proc.describe(proc))

    def timeout(self, attempt: Attempt, now: float) -> None:
        """Past ``--timeout``: its clients ended through terminate_client, then SIGTERM as the
        task would take it without the shield (``supervise.deliver``); SIGKILL ``grace``
        seconds later (``overdue``) if it still runs."""
        attempt.ended_by = "timeout"
        tree = attempt.rank.tree()
        if attempt.rank.daemon is not None:
            attempt.rank.ended += len(
                attempt.rank.daemon.end_clients({p.pid for p in tree}).terminated
            )
        deliver([attempt.rank], signal.SIGTERM)
        attempt.kill_at = now + self.grace

    @staticmethod
    def overdue(attempt: Attempt, now: float) -> None:
        """SIGKILL for a timed-out attempt whose grace has run out."""
        if attempt.kill_at is not None and now >= attempt.kill_at:
            log.warning("%s still running after its timeout's grace: killing it", attempt.rank.name)
            _proc.kill_procs(attempt.rank.tree(), signal.SIGKILL)
            attempt.kill_at = None

    def _orphaned(self) -> None:
        """The guard's ladder, the farm gone: every process of the farm's tag, through each
        GPU's daemon, then SIGTERM and SIGKILL."""
        found = [p for p, env in _proc.procs_with_env(TREE_VAR) if _mine(env, self.tag)]
        if not found:
            return
        log.warning(
            "farm gone: ending %d task process(es) through MPS terminate_client", len(found)
        )
        for daemon in self.daemons:
            daemon.end_clients({p.pid for p in found})
        end_procs(found, signal.SIGTERM, self.grace, tree=True)


def _mine(env: Mapping[str, str], tag: str) -> bool:
    return env.get(TREE_VAR, "").startswith(f"{tag}-")
