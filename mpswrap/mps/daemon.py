"""One per-GPU MPS control daemon: start, status, stop. Every verb is idempotent.

Start (under the GPU's file lock): private dirs owned by the job user, the daemon spawned fully
detached as that user with ``CUDA_VISIBLE_DEVICES=<UUID>`` and pinned near its GPU, readiness
by a real control query with bounded backoff, defaults applied before any client, manifest.

Stop is the teardown ladder: terminate_client for every client, bounded wait, SIGKILL what
survived; then ``quit`` (bounded); then end what is left of the daemon; remove the
directories; report leftovers. Never ``quit`` while a client is alive: the daemon would block
and refuse every other command.

As root, a daemon is started in a cgroup of root's (``_cgroup``) and written down in root's
record (``rootrecord``) before and after it starts; stop, status and a second start take who
the daemon is from there, never from the files in the job user's directories.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Generator
from pathlib import Path

from .. import _proc, _wait, trust
from .._cgroup import Cgroup
from .._lock import RootLock, file_lock
from .._struct import replace
from ..config import Settings
from ..errors import ControlError, DaemonError, LayoutError, MpswrapError
from ..paths import GpuDirs, ensure_private_dir
from .control import DEADLINE_PASSED, Control, client_status, find_binary
from .gpu import GpuInfo
from .manifest import Manifest, read_manifest
from .rootrecord import Held, RootSide, pinned_control, read_held, remove_held, unpin
from .start import Defaults, Start

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

    from .._lock import FileLock
    from .identity import Identity
    from .ladder import Ladder, StopReport

__all__ = ["Daemon", "Defaults", "finish"]

log = logging.getLogger(__name__)


class Daemon:
    """The daemon of one GPU directory (``<job>/<key>``), started or found there."""

    def __init__(
        self,
        dirs: GpuDirs,
        lock: Path | RootLock | RootSide,
        settings: Settings,
        ranks_lock: Path | None = None,
    ) -> None:
        self.dirs = dirs
        self.settings = settings
        self._lock_at = lock
        #: Root's own state of this daemon (its lock, record and cgroup); None in user mode.
        self.root = lock if isinstance(lock, RootSide) else None
        #: Taken around control commands that ranks send (their ladders, many at once).
        self.ranks_lock = ranks_lock

    @functools.cached_property
    def _lock(self) -> FileLock | RootLock:
        """The start/stop lock, made on first use (start and stop take it; queries do not):
        root's own (``RootLock``), or the job user's file in its job directory."""
        if isinstance(self._lock_at, RootSide):
            return self._lock_at.lock
        if isinstance(self._lock_at, RootLock):
            return self._lock_at
        return file_lock(self._lock_at, timeout=self.settings.start_timeout * 4)

    @property
    def control(self) -> Control:
        return self.control_within(_wait.NO_DEADLINE)

    def control_within(self, deadline: _wait.Deadline) -> Control:
        """The control program for this daemon, every command drawn from ``deadline``; as
        root, through the socket root pinned when the daemon started (never one the job user
        put in the pipe directory since)."""
        pinned = pinned_control(self.root, self.held()) if self.root else None
        return Control(
            find_binary(self.settings.control_binary),
            pinned or self.dirs.pipe,
            self.dirs.log,
            timeout=self.settings.command_timeout,
            user=self._commander(),
            deadline=deadline,
            shown=self.dirs.pipe,
        )

    def held(self) -> Held | None:
        """Root's record of this daemon (None in user mode, or where root started none)."""
        return read_held(self.root.record) if self.root else None

    def identity(self) -> Identity | None:
        """Who the daemon is, from root's record and cgroup (None in user mode: the ladder
        reads the user's own manifest). A job directory without a record of root's has no
        daemon of root's to end: only its cgroup, where it has one."""
        if self.root is None:
            return None
        from .identity import Identity

        held = self.held()
        cgroup = Cgroup(Path(held.cgroup)) if held and held.cgroup else self.root.cgroup
        return Identity(
            held.daemon if held else None,
            cgroup=cgroup if cgroup and cgroup.exists() else None,
            uid=held.uid if held else None,
        )

    def _commander(self) -> _proc.UserIds | None:
        """Who sends the control commands: as root, the owner of the job directory. The pipe
        directory is theirs, and a socket in it may be their link to another user's daemon:
        sent as them, the kernel keeps the command out of that user's 0700 directory."""
        if not trust.is_root():
            return None
        owner = self._owner()
        return None if owner in (None, 0) else _proc.lookup_user(owner)

    def _owner(self) -> int | None:
        """The job directory's owner, as the kernel says (never what a file in it says);
        None where the whole tree is gone."""
        try:
            return os.lstat(self.dirs.root.parent).st_uid
        except FileNotFoundError:
            return None  # the whole tree is gone: no socket to reach anything through
        except OSError as exc:
            raise LayoutError(
                "cannot tell whose daemon this is",
                thing=str(self.dirs.root.parent),
                cause=exc.strerror or str(exc),
            ) from exc

    def manifest(self) -> Manifest | None:
        return read_manifest(self.dirs.manifest)

    # The teardown's modules (the ladder, the MPS log's reader, the job's record) load when
    # a teardown or a status needs them: a rank's start and the prolog's do without them.
    def _ladder(self, deadline: _wait.Deadline = _wait.NO_DEADLINE) -> Ladder:
        """The ladder of this daemon: without a control program root may run (or none at
        all), everything of the daemon is still ended, by signal."""
        from .ladder import Ladder

        try:
            control: Control | None = self.control_within(deadline)
        except MpswrapError as exc:
            log.warning("%s: ending the daemon by signal: %s", self.dirs.key, exc.line())
            control = None
        held = self.held()
        return Ladder(
            self.dirs,
            control,
            self.settings,
            self.ranks_lock,
            identity=self.identity(),
            deadline=deadline,
            origin=_origin(held) if held else {},
        )

    def _report(self) -> StopReport:
        from .ladder import StopReport

        return StopReport(self.dirs.key)

    # --- start ------------------------------------------------------------------------
    def starting(
        self,
        gpu: GpuInfo,
        user: _proc.UserIds,
        *,
        node: str,
        job_id: str,
        started_by: str,
        defaults: Defaults,
        allowed_cpus: frozenset[int] | None = None,
    ) -> Generator[None, None, Manifest]:
        """Start the daemon for ``gpu`` as ``user`` in two steps; a running one is returned
        unchanged.

        The first ``next()`` takes the lock and launches ``nvidia-cuda-mps-control -d``; the
        second waits until the daemon answers and returns its manifest (``finish``): a node's
        daemons come up together. Closed in between, it stops what it launched and unlocks.
        """
        self.dirs.check_socket_length()
        binary = find_binary(self.settings.control_binary)
        origin = {"node": node, "job_id": job_id, "started_by": started_by}
        lock = self._lock
        lock.acquire()
        try:
            current = self._running()
            if current is not None:
                self._serves(current, gpu)
                log.info("daemon for %s already running (pid %d)", gpu.uuid, current.daemon_pid)
                yield
                return current
            self._prepare(user)
            start = Start(
                self.dirs,
                gpu,
                user,
                binary,
                replace(self.control, pipe=self.dirs.pipe),  # the new daemon's, root pins it
                self.settings,
                self._cpus(gpu, allowed_cpus),
                origin,
                defaults,
                self.root,
            )
            return (yield from self._start_new(start))
        finally:  # root's lock file goes where its daemon failed to start
            lock.release(remove=not os.path.lexists(self.dirs.root))

    def _start_new(self, start: Start) -> Generator[None, None, Manifest]:
        """``starting`` for a daemon not running yet (its lock held): launch, then finish;
        on any failure, or closed in between, stop what was launched."""
        launched: _proc.Popen[str] | None = None
        try:
            launched = start.launch()
            yield
            return start.finish(launched)
        except BaseException:
            if launched is not None and launched.returncode is None:
                start.detached(launched)  # closed before the second step: reap '-d'
            self._ladder(_wait.Deadline(self.settings.teardown_deadline)).stop(self._report())
            self._forget()
            raise

    def _prepare(self, user: _proc.UserIds) -> None:
        """Clear what a crashed daemon left; make the private directories."""
        self._clear_stale()
        for path in (self.dirs.root, self.dirs.pipe, self.dirs.log):
            ensure_private_dir(path, user.uid, user.gid)

    def _cpus(self, gpu: GpuInfo, allowed: frozenset[int] | None) -> list[int]:
        if not self.settings.cpu_binding or not gpu.cpus:
            return []
        cpus = gpu.cpus & allowed if allowed else gpu.cpus
        if not cpus and allowed:
            # Still inside what the job may use, if not near the GPU.
            log.warning("GPU %s: its local CPUs are outside the allowed set", gpu.uuid)
            cpus = allowed
        return sorted(cpus)

    def _serves(self, current: Manifest, gpu: GpuInfo) -> None:
        """A running daemon is this GPU's (root's record says which, as root), or nobody's
        to join: a client of it would run on another GPU."""
        held = self.held() if self.root is not None else None
        serving = held.gpu_uuid if held is not None else current.gpu_uuid
        if serving != gpu.uuid:
            raise DaemonError(
                "this GPU's directory has another GPU's daemon",
                thing=f"{self.dirs.root}: {serving}, pid {current.daemon_pid}",
                cause=f"asked to start one for {gpu.uuid}",
                hint="stop that job's daemons first (mpswrap stop --job ID), or use another --job",
            )

    def _running(self) -> Manifest | None:
        try:
            manifest = self.manifest()
        except MpswrapError:
            return None
        if manifest is None:
            return None
        daemon = manifest.daemon
        if self.root is not None:  # as root: the record's daemon, never the manifest's
            held = self.held()
            if held is None or held.daemon is None or held.daemon != daemon:
                return None
        if _proc.is_alive(daemon) and self.control.ping():
            return manifest
        return None

    def _forget(self) -> None:
        """Root's record, and the socket it pinned, go with the daemon it named."""
        if self.root is not None:
            unpin(self.root, self.held())
            remove_held(self.root.record)

    def forget(self, where: Path) -> None:
        """After the daemon was ended by signal alone (its ladder failed): its directory, its
        cgroup and root's record go."""
        from ..removal import remove_tree

        remove_tree(where)
        if self.root is not None and self.root.cgroup is not None:
            self.root.cgroup.remove()
        self._forget()

    def _clear_stale(self) -> None:
        """Leftovers of a crashed daemon: stop what is known of it, remove the dirs."""
        identity = self.identity()
        there = identity is not None and (identity.daemon or identity.cgroup)
        if os.path.lexists(self.dirs.root) or there:  # a symlink planted there is removed too
            report = self._ladder(_wait.Deadline(self.settings.teardown_deadline)).stop(
                self._report()
            )
            # A directory that could not be removed holds nothing alive: it is reused.
            if report.leftovers:
                raise DaemonError(
                    "stale MPS processes survive",
                    thing=str(self.dirs.root),
                    cause="; ".join(report.leftovers),
                )
            self._forget()  # the stale daemon's record and pinned socket

    # --- status -----------------------------------------------------------------------
    def status(self, deadline: _wait.Deadline = _wait.NO_DEADLINE) -> dict[str, Any]:
        """This daemon as ``status`` shows it, its control commands drawn from ``deadline``
        (past it: "not answered in time"). As root, who it is comes from root's record; else
        from the manifest (a user-mode daemon's, read as hints: an unreadable one is named,
        never fatal)."""
        info: dict[str, Any] = {
            "key": self.dirs.key,
            "pipe_dir": str(self.dirs.pipe),
            "log_dir": str(self.dirs.log),
            "uuid": None,
            "daemon": None,
            "servers": [],
            "faults": [],
        }
        found = self._known()
        if isinstance(found, str):
            info["error"] = found
        elif found is not None:
            daemon, facts = found
            info["uuid"] = facts["uuid"]
            info["daemon"] = {"pid": daemon.pid, "alive": _proc.is_alive(daemon), **facts["daemon"]}
            info["settings"] = facts["settings"]
        if deadline.passed:  # no more of the job user's files either
            info["error"] = f"{NOT_IN_TIME} ({deadline.seconds:g} s)"
            return info
        from .mpslog import read_faults

        info["faults"] = [f.to_json() for f in read_faults(self.dirs.server_log)]
        if info["daemon"] and info["daemon"]["alive"] and found and not isinstance(found, str):
            info.update(self._live_status(found[1]["uid"], deadline))
        active = {s["pid"] for s in info["servers"] if s["status"] == "ACTIVE"}
        for fault in info["faults"]:  # the live state outranks the log's wording
            fault["recovered"] = fault["recovered"] or fault["server_pid"] in active
        return info

    def _known(self) -> tuple[_proc.ProcId, dict[str, Any]] | str | None:
        """(the daemon, what is known of it) from root's record (as root) or the manifest;
        None where neither names one, a line where the manifest cannot be read."""
        if self.root is not None:
            held = self.held()
            if held is None or held.daemon is None:
                return None
            facts = {"started_by": held.started_by, "user": held.user, "cpus": held.cpus}
            return held.daemon, {
                "uuid": held.gpu_uuid,
                "daemon": facts,
                "settings": held.settings,
                "uid": held.uid,
            }
        try:
            manifest, owner = self.manifest(), self._owner()
        except MpswrapError as exc:
            return exc.line()
        if manifest is None:
            return None
        # Who the user is: the directory's owner, never the manifest's word ("root").
        user = manifest.user if owner is None else _proc.user_name(owner)
        facts = {"started_by": manifest.started_by, "user": user, "cpus": manifest.cpus}
        return manifest.daemon, {
            "uuid": manifest.gpu_uuid,
            "daemon": facts,
            "settings": manifest.settings,
            "uid": owner,  # never the manifest's: its "uid": 0 would name root's processes
        }

    def _live_status(self, uid: int | None, deadline: _wait.Deadline) -> dict[str, Any]:
        """What the daemon answers within ``deadline``; clients' environments read only where
        they run as ``uid`` (root's record's, or the owner of the job directory)."""
        out: dict[str, Any] = {"servers": []}
        try:
            if deadline.passed:
                raise ControlError("not asked", cause=DEADLINE_PASSED)
            # The listing is the job user's word: as root, only servers the daemon holds
            # (root's record and cgroup) are asked about, shown and exported.
            ident = self.identity()
            keep = None if ident is None else ident.holder()
            found = self.control_within(deadline).snapshot(keep=keep)
        except ControlError as exc:
            late = deadline.passed and deadline.seconds is not None
            out["error"] = f"{NOT_IN_TIME} ({deadline.seconds:g} s)" if late else exc.line()
            return out
        out["default_active_thread_percentage"] = found.default_active_thread_percentage
        if found.passed_over:
            log.warning(
                "%s: %d listed server(s) not the daemon's: not shown",
                self.dirs.key,
                found.passed_over,
            )
        for server, (state, share, clients) in found.servers.items():
            listed = (client_status(c, uid) for c in clients[:CLIENTS_SHOWN])
            out["servers"].append(
                {
                    "pid": server,
                    "status": state,
                    "active_thread_percentage": share,
                    "clients": [c for c in listed if c is not None],
                }
            )
        return out

    def clients(self) -> list[int]:
        """The clients of every server of this daemon now (none when it does not answer)."""
        try:
            return [pid for pids in self.control.clients().values() for pid in pids]
        except ControlError:
            return []

    # --- stop -------------------------------------------------------------------------
    def stop(self, deadline: _wait.Deadline = _wait.NO_DEADLINE) -> StopReport:
        """The teardown ladder, within ``deadline``; harmless when nothing is running or
        nothing exists. As root, root's record and the cgroup say what there is to end,
        also where the job user removed the directory."""
        report = self._report()
        if not self._anything():
            return report
        lock = self._lock
        try:
            if isinstance(lock, RootLock):
                lock.acquire(deadline.left())
            else:
                lock.acquire()
        except LayoutError:
            if self._anything():
                raise
            return report  # ended meanwhile, its directory gone (its owners' watchdog)
        try:  # another hook of the job may have stopped it while we waited: a no-op then
            if self._anything():
                self._ladder(deadline).stop(report)
                if not report.leftovers:
                    self._forget()
        finally:  # root's lock file goes with root's state of the daemon it guarded
            lock.release(remove=not self._guarded())
        return report

    def drop_lock(self, deadline: _wait.Deadline) -> None:
        """Root's lock file of a daemon root holds nothing of (no record, no cgroup): what an
        earlier teardown left. Taken within ``deadline``, then removed where root still holds
        nothing of it (a prolog of the job may have started one meanwhile)."""
        lock = self._lock
        if self.root is None or not isinstance(lock, RootLock) or not lock.path.exists():
            return
        lock.acquire(deadline.left())
        lock.release(remove=not self._guarded())

    def _guarded(self) -> bool:
        """Whether the start/stop lock still guards something: root's record or cgroup of the
        daemon where root keeps them (whatever is left of the job user's directory is no
        longer root's to guard: the job's teardown removes it), else the directory."""
        if self.root is None:
            return _there(self.dirs.root)
        return self.root.record.exists() or bool(self.root.cgroup and self.root.cgroup.exists())

    def _anything(self) -> bool:
        """Whether there is anything of this daemon: its directory, or (as root) a record or
        a cgroup of root's."""
        return _there(self.dirs.root) or self._guarded()

    def end_clients(self, pids: set[int]) -> StopReport:
        """End those of ``pids`` that are clients here (a rank's ladder): terminate_client,
        and ``shutdown_server -f`` past ``terminate_window`` for a server whose clients are
        all among them; SIGKILL survivors. The safe way to end a busy client: a signal can
        wedge the server."""
        report = self._report()
        self._ladder().end_clients(report, pids)
        return report


#: What ``status`` says of a daemon its deadline left no time to ask, or that did not answer
#: before it passed.
NOT_IN_TIME = "not answered in time: status's deadline passed"
#: Clients of one server ``status`` describes at most (MPS serves 48 to 60).
CLIENTS_SHOWN = 128


def _origin(held: Held) -> dict[str, Any]:
    """What root's record says of who ran what, for the archive's record (mps/record)."""
    return {
        "gpu_uuid": held.gpu_uuid,
        "user": held.user,
        "started_by": held.started_by,
        "daemon_started": held.started,
    }


def finish(steps: Generator[None, None, Manifest]) -> Manifest:
    """The second step of ``Daemon.starting``: its manifest."""
    try:
        next(steps)
    except StopIteration as done:
        manifest: Manifest = done.value
        return manifest
    raise AssertionError("Daemon.starting yields once")  # pragma: no cover


def _there(path: Path) -> bool:
    """Whether ``path`` is there: anything but "no such file" counts, a link or a mount that
    refuses us (a user's FUSE mount refuses even root) included."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True
