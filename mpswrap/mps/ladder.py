"""The teardown ladder of one per-GPU daemon: end its clients, quit it, kill what survives.

terminate_client for every client (or the ranks being ended), bounded wait, SIGKILL what
survived; then ``quit`` (bounded); then end what is left of the daemon (``Identity.end``: its
cgroup, else its process tree); remove the directories; report leftovers. Never ``quit`` while
a client is alive: the daemon would block and refuse every other command.

Who the daemon is comes from ``identity`` (root's record and cgroup, or a user-mode daemon's
own manifest); what the control socket answers is a hint: a listed client is ended only if it
is the job user's, started after the daemon and no other Slurm job's, and a listed server
only if it is the daemon's. Every command, wait and scan draws from one ``Deadline``, and the
work a job user can multiply is capped. Directories are removed through descriptors
(``remove_tree``): the job's user may swap a symlink in at any level while root removes its
tree.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import _proc, _wait, trust
from .._lock import maybe_locked
from .._struct import Struct, field, replace
from ..config import Settings
from ..errors import ControlError, LayoutError, MpswrapError, one_line
from ..paths import ROOT_ONLY, GpuDirs, check_dirs, read_job_file
from ..removal import remove_tree
from . import record
from .control import Control, read_pid
from .identity import Identity, other_job
from .manifest import Manifest, read_manifest
from .mpslog import LOG_LIMIT, Fault, GpuLogs, MpsLog

__all__ = ["Ladder", "StopReport"]

log = logging.getLogger(__name__)


class StopReport(Struct):
    key: str
    terminated: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    #: Daemon or server PIDs that needed a signal after quit.
    forced: list[int] = field(default_factory=list)
    #: Processes that survived the ladder, and paths that could not be removed.
    leftovers: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Servers shut down with their clients (``shutdown_server -f``): pid -> clients ended.
    shut_down: dict[int, int] = field(default_factory=dict)
    #: The clients ended with their server.
    dropped: list[int] = field(default_factory=list)
    #: What server.log said before the directory was removed.
    log_terminations: int = 0
    log_faults: int = 0

    @property
    def clean(self) -> bool:
        return not self.leftovers and not self.paths

    def ended(self) -> dict[str, Any]:
        """How the clients and servers were ended, for the job's record (mps/record)."""
        return {
            "ended_by_terminate_client": self.terminated,
            "ended_with_server": self.dropped,
            "servers_shut_down": {str(pid): n for pid, n in self.shut_down.items()},
            "killed": self.killed,
            "terminations_logged": self.log_terminations,
            "leftovers": self.leftovers,
        }

    def lines(self) -> list[str]:
        """The report as people read it (stop, the epilog, run's teardown)."""
        notes = f"; {'; '.join(self.notes)}" if self.notes else ""
        forced = f", forced daemon/server {self.forced}" if self.forced else ""
        shut = (
            f", shut down server {', '.join(map(str, self.shut_down))} with "
            f"{sum(self.shut_down.values())} client(s)"
            if self.shut_down
            else ""
        )
        head = (
            f"{self.key}: terminated {len(self.terminated)} client(s){shut}, killed "
            f"{len(self.killed)}{forced}; server.log: {self.log_terminations} client "
            f"termination(s) succeeded, {self.log_faults} fatal error(s){notes}"
        )
        left = (f"{self.key}: LEFT BEHIND: {item}" for item in self.leftovers + self.paths)
        return [one_line(line) for line in (head, *left)]  # notes hold the job user's replies


class Ladder(Struct):
    """The ladder for the daemon of ``dirs``, spoken to through ``control``."""

    dirs: GpuDirs
    #: None: no control program root may run (``trust``): everything is ended by signal.
    control: Control | None
    settings: Settings
    #: Taken around the control commands: ranks' ladders run many at once.
    ranks_lock: Path | None = None
    #: Who the daemon is (root's record and cgroup); None: a user-mode daemon of this
    #: process's own user, named by its manifest.
    identity: Identity | None = None
    #: What bounds the whole ladder (the epilog's deadline); each step takes its share.
    deadline: _wait.Deadline = _wait.NO_DEADLINE
    #: What the job's records said of the daemon, for the archive's record (mps/record).
    origin: dict[str, Any] = field(default_factory=dict)
    #: Other users' processes already named in a warning (each is named once).
    _named: set[_proc.ProcId] = field(default_factory=set)

    def manifest(self) -> Manifest | None:
        return read_manifest(self.dirs.manifest)

    @property
    def _commands(self) -> Control:
        """The control program, for the steps that run only where there is one."""
        assert self.control is not None
        return self.control

    @property
    def _job(self) -> str:
        return self.dirs.root.parent.name

    def stop(self, report: StopReport) -> StopReport:
        """The whole ladder (the caller holds the daemon's start/stop lock)."""
        dirs = self.dirs
        ident = self.identity or self._user_identity(report)
        link = next((p for p in (dirs.root, dirs.pipe, dirs.log) if os.path.islink(p)), None)
        if link is not None:
            # Planted by the directory's owner: commands and reads would reach whatever it
            # points at. What the daemon started is ended by identity alone.
            report.notes.append(f"refusing a path that is not a plain directory ({link})")
        elif self.control is not None and ident.daemon_alive():
            log.debug("%s: stopping daemon %s", dirs.key, ident.daemon)
            # The polite steps leave FORCE_RESERVE of the deadline to the forced end, however
            # long a daemon that never answers (stopped, traced by its user) makes them wait.
            sooner = self.deadline.reserving(FORCE_RESERVE)
            control = replace(self.control, deadline=sooner)
            polite = replace(self, control=control, deadline=sooner)
            polite._end_clients(report, None, ident)
            log.debug("%s: clients gone; quit", dirs.key)
            polite._quit(report)
            # quit returns before the server has exited (about 80 ms later on an H100).
            _wait.wait_gone(ident.members(), polite.deadline.bound(self.settings.quit_timeout))
            log.debug("%s: daemon and servers gone", dirs.key)
        report.forced += [p.pid for p in ident.members()]
        report.leftovers += [_proc.describe(p) for p in ident.end(self.deadline)]
        if self.identity is None:
            self._sweep(report)
        if link is None and self._logs_in_time(report):
            # control.log only for the archive's record (the clients seen): root never needs it.
            logs = GpuLogs.read(dirs, control=bool(self.settings.log_archive))
            faults = logs.server.faults()
            report.log_terminations = logs.server.terminations()
            report.log_faults = len(faults)
            self._archive_logs(report, logs, faults)
        log.debug("%s: ended what was left; logs read and archived", dirs.key)
        if not report.leftovers:
            problem = remove_tree(dirs.root, self.deadline)
            if problem:
                report.paths.append(problem)
            if ident.cgroup is not None and not ident.cgroup.remove():
                report.paths.append(f"cgroup {ident.cgroup.path} (not removed)")
        return report

    def _user_identity(self, report: StopReport) -> Identity:
        """A user-mode daemon of this process's own user: the manifest's daemon and servers,
        else the pid file's daemon; servers its first client started are named in
        control.log, trusted only as this user's processes whose pipe directory is this one."""
        try:
            manifest = self.manifest()
        except MpswrapError as exc:
            report.notes.append(exc.line())
            manifest = None
        daemon = manifest.daemon if manifest else _identify_pidfile(self.dirs.pid_file)
        servers = list(manifest.server_ids) if manifest else []
        logged = MpsLog.read(self.dirs.control_log).server_pids() - {s.pid for s in servers}
        servers += _with_pipe(str(self.dirs.pipe), self._job, among=logged) if logged else []
        return Identity(daemon, servers=servers, uid=os.geteuid())

    def _naming_pipe(self) -> list[_proc.ProcId]:
        """This user's processes whose ``CUDA_MPS_PIPE_DIRECTORY`` is exactly this pipe
        directory and that are no other Slurm job's (a path elsewhere in an environment, as
        ``OLDPWD`` after a ``cd``, names nothing)."""
        return _with_pipe(str(self.dirs.pipe), self._job)

    def _sweep(self, report: StopReport) -> None:
        """User mode: what of this user's still uses this pipe directory once the daemon is
        gone (a rank's child that outlived it, a client nobody could terminate) is ended by
        signal, as Slurm ends a job's processes, in rounds while new ones appear; what is
        found after the last round is left behind."""
        for _ in range(3):
            found = [p for p in self._naming_pipe() if _proc.is_alive(p)]
            if not found:
                break
            log.info(
                "%s: ending %s, still using %s",
                self.dirs.key,
                ", ".join(map(_proc.describe, found)),
                self.dirs.pipe,
            )
            report.killed += [p.pid for p in found]
            _wait.end_procs(found, grace=self.deadline.bound(_wait.TERM_GRACE))
            if self.deadline.passed:  # one round at least: past the deadline, SIGKILL at once
                break
        report.leftovers += [_proc.describe(p) for p in self._naming_pipe()]

    def end_clients(self, report: StopReport, only: set[int] | None) -> list[_proc.ProcId]:
        return self._end_clients(report, only, self.identity or self._user_identity(report))

    def _logs_in_time(self, report: StopReport) -> bool:
        """Whether the logs are read (and archived): only while ``LOGS_RESERVE`` seconds of the
        deadline are left. What they say is advisory (root's record says what is ended):
        near the deadline, what is left of it goes to ending and removing."""
        if self.deadline.left() >= LOGS_RESERVE:
            return True
        report.notes.append("logs not read nor archived: the teardown's deadline is near")
        return False

    def _archive_logs(self, report: StopReport, logs: GpuLogs, faults: list[Fault]) -> None:
        """Keep the MPS logs and the job's record (mps/record) for post-mortems (setting
        log_archive) before the dirs go; older ones past log_archive_days go. The record
        says what ``logs`` (the teardown's one reading) say; the logs are copied as read."""
        archive = self.settings.log_archive
        if not archive:
            return
        job_dir = self.dirs.root.parent
        prefix = f"{job_dir.parent.name}-{job_dir.name}-{self.dirs.key}"
        try:
            if trust.is_root():  # root writes and prunes there: no one else may swap a level
                check_dirs(Path(archive), ROOT_ONLY)
            os.makedirs(archive, mode=0o755, exist_ok=True)
            if trust.is_root():
                check_dirs(Path(archive), ROOT_ONLY)
            record.prune(Path(archive), self.settings.log_archive_days)
            for log_file in (self.dirs.control_log, self.dirs.server_log):
                _copy_regular(log_file, Path(archive) / f"{prefix}-{log_file.name}")
            found = record.record_of(self.dirs, self._origin(), report.ended(), logs, faults)
            record.write_record(Path(archive), prefix, found)
        except LayoutError as exc:
            report.notes.append(f"not archiving logs: {exc.line()}")
        except OSError as exc:
            report.notes.append(f"cannot archive logs to {archive}: {exc.strerror}")

    def _origin(self) -> dict[str, Any]:
        """Who ran what, for the archive: root's record's (``origin``), else the manifest's."""
        if self.origin:
            return self.origin
        try:
            manifest = self.manifest()
        except MpswrapError:
            manifest = None
        return record.origin_of(manifest)

    def _end_clients(
        self, report: StopReport, only: set[int] | None, ident: Identity
    ) -> list[_proc.ProcId]:
        """THE client-ending ladder: terminate_client every client (or those in ``only``),
        wait (bounded), SIGKILL those still alive; returns the servers it found.

        The server serves one client's termination at a time (about 170 ms each with 48 busy
        clients on an H100). So for ``terminate_window`` seconds clients are terminated one by
        one (each gets a clean 810 error); a server all of whose clients are being ended is
        then shut down with the rest (``shutdown_server -f``: they fail at their next CUDA
        call, by SIGPIPE or 806, and the GPU stays healthy, as seen on an H100). A server that
        also serves clients not being ended goes on terminating one by one.

        What the daemon lists is a hint: a server that is not the daemon's own is left alone,
        and a client is signalled only if ``_may_end`` says so.

        The commands go under the ranks' lock: the real daemon refuses a command while it
        serves another ("Cannot send command"), and twelve ladders at once on an H100 ran out
        of retries. Waiting for the clients to exit is not serialised.
        """
        clients: list[_proc.ProcId] = []
        if self.control is None:
            return []
        with maybe_locked(
            self.ranks_lock, self.deadline.bound(self.settings.terminate_timeout * 4)
        ):
            listing = self._listing(report, ident)
            window = time.monotonic() + self.deadline.bound(self.settings.terminate_window)
            for server, pids in listing.items():
                ending = [p for p in pids if only is None or p in only]
                whole = len(ending) == len(pids)
                for index, pid in enumerate(ending):
                    if self.deadline.passed:
                        break
                    if whole and time.monotonic() >= window:
                        clients += self._shutdown(server, ending[index:], set(ending), report)
                        break
                    clients += self._terminate(server, pid, report)
        # Each listed once, and only while the deadline lasts: the list is the job user's.
        clients = [
            c
            for c in dict.fromkeys(clients)
            if not self.deadline.passed and self._may_end(c, ident)
        ]
        log.debug("%s: %d client(s) asked to end; waiting for them", self.dirs.key, len(clients))

        def killed(left: list[_proc.ProcId]) -> list[_proc.ProcId]:
            """Terminated but still running (not in a CUDA call for that long): SIGKILLed."""
            log.debug(
                "%s: %d client(s) ended, %d still alive", self.dirs.key, len(clients), len(left)
            )
            report.killed += [p.pid for p in left]
            return left

        # terminate_client was the request to end: no signal before the SIGKILL.
        grace = self.deadline.bound(self.settings.terminate_timeout)
        _wait.end_procs(clients, None, grace, before_kill=killed)
        return [p for p in map(_proc.identify, listing) if p]

    def _listing(self, report: StopReport, ident: Identity) -> dict[int, list[int]]:
        """The daemon's servers and their clients, as it lists them: only servers that are
        the daemon's own (``ident.holds``), each with at most ``CLIENTS_CAP`` clients."""
        try:
            servers = self._commands.server_list()
        except ControlError as exc:
            report.notes.append(f"cannot list servers: {exc.cause}")
            return {}
        servers = servers[:SERVERS_CAP]
        mine, strangers = {}, [s for s in servers if not ident.holds(s)]
        if strangers:
            report.notes.append(f"{len(strangers)} listed server(s) not the daemon's: left alone")
        for server in (s for s in servers if s not in strangers):
            try:
                mine[server] = self._commands.client_list(server)[:CLIENTS_CAP]
            except ControlError as exc:
                report.notes.append(f"cannot list clients of server {server}: {exc.cause}")
        return mine

    def _may_end(self, client: _proc.ProcId, ident: Identity) -> bool:
        """A listed client is signalled only if it is the job user's, started after the daemon
        and is no other Slurm job's: the list comes through a socket the job user controls."""
        uid = _proc.uid_of(client)
        if uid is None:
            return False  # gone already: nothing to end
        if ident.uid is not None and uid != ident.uid:
            self._not_mine(client, ident)
            return False
        if ident.daemon is not None and client.start_time < ident.daemon.start_time - 1:
            return False
        # Root's record names a Slurm job's daemon: where Slurm's cgroups say nothing of the
        # client, the job id slurmstepd gave it does (a user-mode run's job is its own name).
        return not other_job(client.pid, self._job, by_env=self.identity is not None)

    def _not_mine(self, proc: _proc.ProcId, ident: Identity) -> None:
        if proc in self._named:
            return
        self._named.add(proc)
        log.warning(
            "%s: not this job's: %s, of uid %s, listed by %s",
            self.dirs.key,
            _proc.describe(proc),
            _proc.uid_of(proc),
            self.dirs.pipe,
        )

    def _terminate(self, server: int, pid: int, report: StopReport) -> list[_proc.ProcId]:
        ident = _proc.identify(pid)
        try:
            self._commands.terminate_client(server, pid)
            report.terminated.append(pid)
        except ControlError as exc:
            report.notes.append(f"terminate_client {pid}: {exc.cause}")
        return [ident] if ident else []

    def _shutdown(
        self, server: int, pids: list[int], ending: set[int], report: StopReport
    ) -> list[_proc.ProcId]:
        """``shutdown_server -f``: the server ends, and ``pids`` (its clients not terminated
        yet) with it. Only while every client it lists is one of ``ending``: one that
        connected during the window (another step of the job) would end with them, so the
        rest go one by one then."""
        idents = [i for i in map(_proc.identify, pids) if i]
        try:
            if not set(self._commands.client_list(server)) <= ending:
                raise ControlError("not sent", cause="the server has clients that are not ending")
            self._commands.shutdown_server(server, force=True)
        except ControlError as exc:
            report.notes.append(f"shutdown_server {server}: {exc.cause}")
            for pid in pids:  # one by one after all, past the window
                if self.deadline.passed:
                    break
                idents += [i for i in self._terminate(server, pid, report) if i not in idents]
            return idents
        report.shut_down[server] = len(pids)
        report.dropped += pids
        return idents

    def _quit(self, report: StopReport) -> None:
        try:
            self._commands.quit(force_after=self.deadline.bound(self.settings.quit_timeout))
        except ControlError as exc:
            report.notes.append(f"quit: {exc.cause}")


#: Seconds of the deadline that must be left for the logs to be read and archived: reading
#: both is bounded (``mpslog.LINES_LIMIT``), a fraction of this even on a loaded machine.
LOGS_RESERVE = 1.0
#: Seconds of the deadline the polite steps (terminate_client, quit, the wait for it) leave
#: to the forced end: ``cgroup.kill`` or SIGKILL, and the wait for the kernel to reap.
FORCE_RESERVE = 2.0
#: Servers of one daemon the ladder looks at (MPS runs one a user), and clients of one server
#: (MPS serves 48 to 60), at most: a socket in the job user's directory may list any number.
SERVERS_CAP = 64
CLIENTS_CAP = 128


def _copy_regular(src: Path, dest: Path) -> None:
    """Copy the tail of src, only if it is a regular file itself (``read_job_file``): the job
    user owns the log directory and could put a symlink to any file of root's there."""
    text = read_job_file(src, LOG_LIMIT, tail=True)
    if text is not None:  # never through a link planted in the archive directory either
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as out:
            out.write(text)


def _with_pipe(pipe: str, job: str, among: Iterable[int] | None = None) -> list[_proc.ProcId]:
    """This user's processes (of ``among`` where given: the whole process table is read
    otherwise) whose ``CUDA_MPS_PIPE_DIRECTORY`` is ``pipe``, other Slurm jobs' left out
    (Slurm's cgroup, or the ``SLURM_JOB_ID`` slurmstepd gave them, names another)."""
    found = _proc.procs_with_env("CUDA_MPS_PIPE_DIRECTORY", "SLURM_JOB_ID", among=among)
    return [
        proc
        for proc, env in found
        if env["CUDA_MPS_PIPE_DIRECTORY"] == pipe
        and env.get("SLURM_JOB_ID", job) == job
        and not other_job(proc.pid, job)
    ]


def _identify_pidfile(path: Path) -> _proc.ProcId | None:
    """A daemon without manifest (crashed start), trusted only if it is this user's and its
    pipe directory is this one: a stale pid file may name a PID an unrelated process reuses."""
    pid = read_pid(path)
    if not pid:
        return None
    job = path.parent.parent.parent.name  # <job>/<key>/pipe/<pid file>
    return next(iter(_with_pipe(str(path.parent), job, among=[pid])), None)
