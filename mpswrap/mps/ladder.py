"""The teardown ladder of one per-GPU daemon: end its clients, quit it, kill what survives.

terminate_client for every client (or the ranks being ended), bounded wait, SIGKILL what
survived; then ``quit`` (bounded); then kill daemon and servers by PID + start time; remove
the directories; re-scan and report leftovers. Never ``quit`` while a client is alive: the
daemon would block and refuse every other command. Only processes of the directory's owner
are ever signalled. Directories are removed through descriptors (``remove_tree``): the job's
user may swap a symlink in at any level while root removes its tree.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from .. import _proc, _wait, trust
from .._lock import maybe_locked
from .._struct import Struct, field
from ..config import Settings
from ..errors import ControlError, LayoutError, MpswrapError
from ..paths import ROOT_ONLY, GpuDirs, check_dirs, read_job_file
from ..removal import remove_tree
from . import record
from .control import Control, read_pid
from .manifest import Manifest, read_manifest
from .mpslog import LOG_LIMIT, read_faults, server_pids, terminations

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
        return [head, *(f"{self.key}: LEFT BEHIND: {item}" for item in self.leftovers + self.paths)]


class Ladder(Struct):
    """The ladder for the daemon of ``dirs``, spoken to through ``control``."""

    dirs: GpuDirs
    #: None: no control program root may run (``trust``): everything is ended by signal.
    control: Control | None
    settings: Settings
    #: Taken around the control commands: ranks' ladders run many at once.
    ranks_lock: Path | None = None
    #: Other users' processes already named in a warning (each is named once).
    _named: set[_proc.ProcId] = field(default_factory=set)

    def manifest(self) -> Manifest | None:
        return read_manifest(self.dirs.manifest)

    @property
    def _commands(self) -> Control:
        """The control program, for the steps that run only where there is one."""
        assert self.control is not None
        return self.control

    def stop(self, report: StopReport) -> StopReport:
        """The whole ladder (the caller holds the daemon's start/stop lock)."""
        dirs = self.dirs
        link = next((p for p in (dirs.root, dirs.pipe, dirs.log) if os.path.islink(p)), None)
        if link is None and self.control is not None:
            daemon, servers = self._identify(report)
            log.debug(
                "%s: stopping daemon %s, servers %s",
                dirs.key,
                daemon and daemon.pid,
                [s.pid for s in servers],
            )
            # No manifest or pid file to go by: what names this pipe directory may be the
            # daemon, and the commands reach it through the pipe directory all the same.
            ended = [daemon] if daemon else _proc.procs_mentioning(str(dirs.pipe))
            if any(_proc.is_alive(p) for p in ended):
                servers += self._end_clients(report, None)
                self._quit(report)
                # quit returns before the server has exited (about 80 ms later on an H100).
                _wait.wait_gone([*ended, *servers], self.settings.quit_timeout)
        else:
            # Planted by the directory's owner: commands and reads would reach whatever it
            # points at (or no control program may run). What names this pipe directory in
            # its environment (the daemon, its servers, a client) is ended by signal instead.
            if link is not None:
                report.notes.append(f"refusing a path that is not a plain directory ({link})")
            daemon, servers = None, _proc.procs_mentioning(str(dirs.pipe))
        self._force([p for p in [daemon, *servers] if p and _proc.is_alive(p)], report)
        self._sweep(report)
        if link is None:
            report.log_terminations = terminations(dirs.server_log)
            report.log_faults = len(read_faults(dirs.server_log))
            self._archive_logs(report)
        if not report.leftovers:
            problem = remove_tree(dirs.root)
            if problem:
                report.paths.append(problem)
        return report

    def _identify(self, report: StopReport) -> tuple[_proc.ProcId | None, list[_proc.ProcId]]:
        """The daemon and its servers: the manifest's, else the pid file's; servers started
        after the manifest (by the first client) are named in control.log, and trusted only
        while their environment names this pipe directory."""
        try:
            manifest = self.manifest()
        except MpswrapError as exc:
            report.notes.append(exc.line())
            manifest = None
        daemon = manifest.daemon if manifest else _identify_pidfile(self.dirs.pid_file)
        servers = list(manifest.server_ids) if manifest else []
        logged = server_pids(self.dirs.control_log) - {s.pid for s in servers}
        servers += [p for p in _proc.procs_mentioning(str(self.dirs.pipe)) if p.pid in logged]
        return daemon, servers

    def _force(self, procs: list[_proc.ProcId], report: StopReport) -> None:
        """SIGTERM, then SIGKILL, what is still alive of the owner's; survivors are reported."""
        owned = self._owned(procs, report)
        report.forced += [p.pid for p in owned]
        report.leftovers += [_proc.describe(p) for p in _wait.end_procs(owned)]

    def _sweep(self, report: StopReport) -> None:
        """What still names this pipe directory once the daemon is gone. The job user's
        processes (a rank's child that outlived it, a client nobody could terminate) are
        ended by signal, as Slurm ends a job's processes, and reported only if they survive
        that. Another user's are noted and left alone: anyone may name any path, so they
        are never this job's to end or to blame."""
        found = [p for p in _proc.procs_mentioning(str(self.dirs.pipe)) if _proc.is_alive(p)]
        mine = self._owned(found, report)
        if not mine:
            return
        log.info(
            "%s: ending %s, still naming %s",
            self.dirs.key,
            ", ".join(map(_proc.describe, mine)),
            self.dirs.pipe,
        )
        report.killed += [p.pid for p in mine]
        _wait.end_procs(mine)
        owners = {_proc.uid_of(p) for p in mine}  # the job user's, as _owned found them
        again = [p for p in _proc.procs_mentioning(str(self.dirs.pipe)) if _proc.is_alive(p)]
        report.leftovers += [_proc.describe(p) for p in again if _proc.uid_of(p) in owners]

    def end_clients(self, report: StopReport, only: set[int] | None) -> list[_proc.ProcId]:
        return self._end_clients(report, only)

    def _archive_logs(self, report: StopReport) -> None:
        """Keep the MPS logs and the job's record (mps/record) for post-mortems (setting
        log_archive) before the dirs go; older ones past log_archive_days go."""
        archive = self.settings.log_archive
        if not archive:
            return
        job_dir = self.dirs.root.parent
        prefix = f"{job_dir.parent.name}-{job_dir.name}-{self.dirs.key}"
        try:
            manifest = self.manifest()
        except MpswrapError:
            manifest = None
        try:
            if trust.is_root():  # root writes and prunes there: no one else may swap a level
                check_dirs(Path(archive), ROOT_ONLY)
            os.makedirs(archive, mode=0o755, exist_ok=True)
            if trust.is_root():
                check_dirs(Path(archive), ROOT_ONLY)
            record.prune(Path(archive), self.settings.log_archive_days)
            for log_file in (self.dirs.control_log, self.dirs.server_log):
                _copy_regular(log_file, Path(archive) / f"{prefix}-{log_file.name}")
            found = record.record_of(self.dirs, manifest, report.ended())
            record.write_record(Path(archive), prefix, found)
        except LayoutError as exc:
            report.notes.append(f"not archiving logs: {exc.line()}")
        except OSError as exc:
            report.notes.append(f"cannot archive logs to {archive}: {exc.strerror}")

    def _end_clients(self, report: StopReport, only: set[int] | None) -> list[_proc.ProcId]:
        """THE client-ending ladder: terminate_client every client (or those in ``only``),
        wait (bounded), SIGKILL those still alive; returns the servers it found.

        The server serves one client's termination at a time (about 170 ms each with 48 busy
        clients on an H100). So for ``terminate_window`` seconds clients are terminated one by
        one (each gets a clean 810 error); a server all of whose clients are being ended is
        then shut down with the rest (``shutdown_server -f``: they fail at their next CUDA
        call, by SIGPIPE or 806, and the GPU stays healthy, as seen on an H100). A server that
        also serves clients not being ended goes on terminating one by one.

        The commands go under the ranks' lock: the real daemon refuses a command while it
        serves another ("Cannot send command"), and twelve ladders at once on an H100 ran out
        of retries. Waiting for the clients to exit is not serialised.
        """
        clients: list[_proc.ProcId] = []
        if self.control is None:
            return []
        with maybe_locked(self.ranks_lock, self.settings.terminate_timeout * 4):
            try:
                listing = self._commands.clients()
            except ControlError as exc:
                report.notes.append(f"cannot list servers: {exc.cause}")
                return []
            deadline = time.monotonic() + self.settings.terminate_window
            for server, pids in listing.items():
                ending = [p for p in pids if only is None or p in only]
                whole = len(ending) == len(pids)
                for index, pid in enumerate(ending):
                    if whole and time.monotonic() >= deadline:
                        clients += self._shutdown(server, ending[index:], set(ending), report)
                        break
                    clients += self._terminate(server, pid, report)

        def killed(left: list[_proc.ProcId]) -> list[_proc.ProcId]:
            """Terminated but still running (not in a CUDA call for that long): the owner's
            are SIGKILLed."""
            alive = self._owned(left, report)
            log.debug(
                "%s: %d client(s) ended, %d still alive", self.dirs.key, len(clients), len(alive)
            )
            report.killed += [p.pid for p in alive]
            return alive

        # terminate_client was the request to end: no signal before the SIGKILL.
        _wait.end_procs(clients, None, self.settings.terminate_timeout, before_kill=killed)
        return [p for p in map(_proc.identify, listing) if p]

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
                idents += [i for i in self._terminate(server, pid, report) if i not in idents]
            return idents
        report.shut_down[server] = len(pids)
        report.dropped += pids
        return idents

    def _owned(self, procs: list[_proc.ProcId], report: StopReport) -> list[_proc.ProcId]:
        """Only processes of the job directory's owner may be signalled: the manifest is that
        user's file, so a PID in it must never make root kill someone else's process. (The
        job directory's, not the GPU directory's: whoever may write the job directory could
        have put a link of its own there.)"""
        try:
            owner = os.lstat(self.dirs.root.parent).st_uid
        except OSError:
            return []
        mine = [p for p in procs if _proc.uid_of(p) in (owner, None)]
        for proc in (p for p in procs if p not in mine and p not in self._named):
            self._named.add(proc)
            log.warning(
                "%s: not this job's: %s, of uid %s, names %s",
                self.dirs.key,
                _proc.describe(proc),
                _proc.uid_of(proc),
                self.dirs.pipe,
            )
            report.notes.append(f"not signalling {proc.pid}: not uid {owner}")
        return mine

    def _quit(self, report: StopReport) -> None:
        try:
            self._commands.quit(force_after=self.settings.quit_timeout)
        except ControlError as exc:
            report.notes.append(f"quit: {exc.cause}")


def _copy_regular(src: Path, dest: Path) -> None:
    """Copy the tail of src, only if it is a regular file itself (``read_job_file``): the job
    user owns the log directory and could put a symlink to any file of root's there."""
    text = read_job_file(src, LOG_LIMIT, tail=True)
    if text is not None:  # never through a link planted in the archive directory either
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as out:
            out.write(text)


def _identify_pidfile(path: Path) -> _proc.ProcId | None:
    """A daemon without manifest (crashed start), trusted only if its environment names this
    pipe directory: a stale pid file may name a PID that an unrelated process reuses."""
    pid = read_pid(path)
    if not pid:
        return None
    return next((p for p in _proc.procs_mentioning(str(path.parent)) if p.pid == pid), None)
