"""Who one GPU's daemon is, and how to end everything it started: THE identity a teardown
acts on.

As root, identity comes from root's record and the cgroup it started the daemon in
(``rootrecord``, ``_cgroup``): the cgroup's processes are the daemon's, whatever the job user
wrote or did (a daemon that execs another program, a server that forks, stays there and ends
with it). Without a cgroup, the record's daemon (PID and start time) and its descendants,
which the kernel's process tree names, are. A user-mode daemon is its user's own: its
manifest (or, without one, its pid file) names it, and the servers it lists.

A process of the job is never found by a string in its environment or command line: another
job of the same user may name this job's paths (a ``cd`` leaves one in ``OLDPWD``).
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Callable

from .. import _proc, _wait
from .._cgroup import Cgroup, member_of, paths_of
from .._struct import Struct, field

__all__ = ["Identity", "other_job"]

log = logging.getLogger(__name__)

#: Rounds of ending a tree without a cgroup: a process that forks as it dies is ended again.
ROUNDS = 5
#: Seconds waited for a killed cgroup to empty even past the deadline: the kernel reaps its
#: processes within milliseconds, and one not yet reaped is not one left behind.
REAP_WAIT = 0.5
_SLURM_JOB = re.compile(r"/job_([0-9]{1,12})(/|$)")


class Identity(Struct):
    """The daemon of one GPU and what it started."""

    daemon: _proc.ProcId | None
    #: The daemon's cgroup (root's); None: the daemon, its descendants and ``servers`` are.
    cgroup: Cgroup | None = None
    #: Servers named besides (user mode: the manifest's, control.log's of the user's own).
    servers: list[_proc.ProcId] = field(default_factory=list)
    #: The job user: only their processes are ever ended as its clients.
    uid: int | None = None

    def daemon_alive(self) -> bool:
        return self.daemon is not None and _proc.is_alive(self.daemon)

    def members(self) -> list[_proc.ProcId]:
        """What of the daemon's runs now: the cgroup's processes; without one, the daemon,
        its descendants and the servers named."""
        if self.cgroup is not None and self.cgroup.exists():
            found = (_proc.identify(pid) for pid in self.cgroup.procs())
            return [p for p in found if p is not None and _proc.is_alive(p)]
        tree: list[_proc.ProcId] = []
        if self.daemon_alive():
            assert self.daemon is not None
            tree = [self.daemon, *_proc.children_of(self.daemon.pid)]
        for server in self.servers:
            if _proc.is_alive(server):
                tree += [server, *_proc.children_of(server.pid)]
        return [p for p in dict.fromkeys(tree) if _proc.is_alive(p)]

    def holds(self, pid: int) -> bool:
        """Whether ``pid`` is one of the daemon's processes now (a server it lists must be)."""
        if self.cgroup is not None and self.cgroup.exists():
            return self.cgroup.holds(member_of(pid))
        return any(p.pid == pid for p in self.members())

    def holder(self) -> Callable[[int], bool]:
        """``holds`` for many PIDs at once: without a cgroup, the members are read once."""
        if self.cgroup is not None and self.cgroup.exists():
            return self.holds
        return {p.pid for p in self.members()}.__contains__

    def end(self, deadline: _wait.Deadline) -> list[_proc.ProcId]:
        """End every member (the polite steps are over: the daemon was asked to quit); return
        what still runs. The cgroup by ``cgroup.kill``, waited for until it is empty; else
        each member by SIGTERM, then SIGKILL, in rounds while new ones appear."""
        if self.cgroup is not None and self.cgroup.exists():
            if self.cgroup.populated():
                self.cgroup.kill()
                self.cgroup.wait_empty(max(deadline.bound(_wait.KILL_WAIT), REAP_WAIT))
            return self.members()
        for _ in range(ROUNDS):
            found = self.members()
            if not found:
                return found
            # Past the deadline no grace: SIGKILL at once, which ends a stopped or traced
            # process too. Never no signal at all.
            grace = deadline.bound(_wait.TERM_GRACE)
            _wait.end_procs(found, signal.SIGTERM, grace, tree=True)
            if deadline.passed:
                break
        return self.members()


def other_job(pid: int, job: str, by_env: bool = False) -> bool:
    """Whether ``pid`` is another Slurm job's than ``job``: never this job's to end.

    Slurm's cgroups decide where one of them names a job (proctrack/cgroup, task/cgroup; the
    cgroup2 tree or any v1 hierarchy, as on a node of cgroup v1 or a hybrid layout). Where
    none does (proctrack/linuxproc, a process outside Slurm) and ``by_env``, the
    ``SLURM_JOB_ID`` slurmstepd gave it does: its user may change that, but only to keep a
    process of their own from this teardown's signals. Otherwise: False."""
    named = {m.group(1) for path in paths_of(pid) if (m := _SLURM_JOB.search(path))}
    if named:
        return named != {job}
    if not by_env:
        return False
    value = _proc.env_value(pid, "SLURM_JOB_ID")
    return value is not None and value != job


def own_uid() -> int:
    return os.geteuid()
