"""One per-GPU MPS control daemon: start, status, stop. Every verb is idempotent.

Start (under the GPU's file lock): private dirs owned by the job user, the daemon spawned fully
detached as that user with ``CUDA_VISIBLE_DEVICES=<UUID>`` and pinned near its GPU, readiness
by a real control query with bounded backoff, defaults applied before any client, manifest.

Stop is the teardown ladder: terminate_client for every client, bounded wait, SIGKILL what
survived; then ``quit`` (bounded); then kill daemon and servers by PID + start time; remove
the directories; re-scan and report leftovers. Never ``quit`` while a client is alive: the
daemon would block and refuse every other command.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
from collections.abc import Generator
from pathlib import Path

from .. import _proc, _wait, trust
from .._lock import RootLock, file_lock
from .._struct import Struct, replace
from ..config import Settings
from ..errors import ControlError, DaemonError, LayoutError, MpswrapError
from ..paths import GpuDirs, create_job_file, ensure_private_dir, read_job_file
from .control import Control, client_status, daemon_env, find_binary, read_pid
from .gpu import GpuInfo
from .manifest import Manifest, read_manifest, write_manifest

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

    from .._lock import FileLock
    from .ladder import Ladder, StopReport

__all__ = ["Daemon", "Defaults", "finish"]

log = logging.getLogger(__name__)

#: What ``nvidia-cuda-mps-control -d`` printed, in the log directory (read when it fails).
START_ERR = "mpswrap-start.err"


class Defaults(Struct, frozen=True):
    """Settings applied to a daemon before its first client, and the ``--threads`` policy
    the task prolog gives each client of a step (``task_threads``: the job's ``--mps=POLICY``;
    recorded in the manifest, sent to no daemon)."""

    active_thread_percentage: float | None = None
    pinned_mem_limit: str | None = None
    client_priority: int | None = None
    prestart_server: bool = False
    task_threads: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> Defaults:
        defaults = cls(
            active_thread_percentage=settings.active_thread_percentage,
            pinned_mem_limit=settings.pinned_mem_limit,
            client_priority=settings.client_priority,
            prestart_server=settings.prestart_server,
        )
        given = {k: v for k, v in overrides.items() if v is not None}
        return replace(defaults, **given)

    def with_percentage(self, percentage: float | None) -> Defaults:
        """These defaults with another active thread percentage (None: keep this one)."""
        if percentage is None:
            return self
        return replace(self, active_thread_percentage=percentage)


class Daemon:
    """The daemon of one GPU directory (``<job>/<key>``), started or found there."""

    def __init__(
        self,
        dirs: GpuDirs,
        lock: Path | RootLock,
        settings: Settings,
        ranks_lock: Path | None = None,
    ) -> None:
        self.dirs = dirs
        self.settings = settings
        self._lock_at = lock
        #: Taken around control commands that ranks send (their ladders, many at once).
        self.ranks_lock = ranks_lock

    @functools.cached_property
    def _lock(self) -> FileLock | RootLock:
        """The start/stop lock, made on first use (start and stop take it; queries do not):
        root's own (``RootLock``), or the job user's file in its job directory."""
        if isinstance(self._lock_at, RootLock):
            return self._lock_at
        return file_lock(self._lock_at, timeout=self.settings.start_timeout * 4)

    @property
    def control(self) -> Control:
        return Control(
            find_binary(self.settings.control_binary),
            self.dirs.pipe,
            self.dirs.log,
            timeout=self.settings.command_timeout,
            user=self._commander(),
        )

    def _commander(self) -> _proc.UserIds | None:
        """Who sends the control commands: as root, the owner of the job directory. The pipe
        directory is theirs, and a socket in it may be their link to another user's daemon:
        sent as them, the kernel keeps the command out of that user's 0700 directory."""
        if not trust.is_root():
            return None
        try:
            owner = os.lstat(self.dirs.root.parent).st_uid
        except FileNotFoundError:
            return None  # the whole tree is gone: no socket to reach anything through
        except OSError as exc:
            raise LayoutError(
                "cannot tell whose daemon this is",
                thing=str(self.dirs.root.parent),
                cause=exc.strerror or str(exc),
            ) from exc
        return None if owner == 0 else _proc.lookup_user(owner)

    def manifest(self) -> Manifest | None:
        return read_manifest(self.dirs.manifest)

    # The teardown's modules (the ladder, the MPS log's reader, the job's record) load when
    # a teardown or a status needs them: a rank's start and the prolog's do without them.
    def _ladder(self) -> Ladder:
        from .ladder import Ladder

        return Ladder(self.dirs, self.control, self.settings, self.ranks_lock)

    def _report(self) -> StopReport:
        from .ladder import StopReport

        return StopReport(self.dirs.key)

    def _stop_ladder(self) -> Ladder:
        """The ladder of a stop: without a control program root may run (or none at all),
        everything of the daemon is still ended, by signal."""
        from .ladder import Ladder

        try:
            control = self.control
        except MpswrapError as exc:
            log.warning("%s: ending the daemon by signal: %s", self.dirs.key, exc.line())
            return Ladder(self.dirs, None, self.settings, self.ranks_lock)
        return Ladder(self.dirs, control, self.settings, self.ranks_lock)

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
                log.info("daemon for %s already running (pid %d)", gpu.uuid, current.daemon_pid)
                yield
                return current
            self._prepare(user)
            cpus = self._cpus(gpu, allowed_cpus)
            new = self._start_new(gpu, user, binary, cpus=cpus, origin=origin, defaults=defaults)
            return (yield from new)
        finally:  # root's lock file goes where its daemon failed to start
            lock.release(remove=not os.path.lexists(self.dirs.root))

    def _start_new(
        self,
        gpu: GpuInfo,
        user: _proc.UserIds,
        binary: str,
        *,
        cpus: list[int],
        origin: dict[str, str],
        defaults: Defaults,
    ) -> Generator[None, None, Manifest]:
        """``starting`` for a daemon not running yet (its lock held): launch, then finish;
        on any failure, or closed in between, stop what was launched."""
        launched: _proc.Popen[str] | None = None
        try:
            launched = self._launch(gpu, user, binary, cpus)
            yield
            self._wait_detached(launched, gpu, binary)
            return self._started(gpu, user, binary, cpus, origin=origin, defaults=defaults)
        except BaseException:
            if launched is not None and launched.returncode is None:
                self._detached(launched)  # closed before the second step: reap '-d'
            self._ladder().stop(self._report())
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

    def _launch(
        self, gpu: GpuInfo, user: _proc.UserIds, binary: str, cpus: list[int]
    ) -> _proc.Popen[str]:
        """``nvidia-cuda-mps-control -d`` as ``user`` on ``cpus``, not waited for."""
        env = daemon_env(
            self.dirs.pipe,
            self.dirs.log,
            {"CUDA_VISIBLE_DEVICES": gpu.uuid, "HOME": user.home, "USER": user.name},
        )
        out = create_job_file(self.dirs.log / START_ERR)  # root's, in the user's directory
        try:
            return _proc.spawn(
                [binary, "-d"],
                env=env,
                user=user,
                cpus=cpus,
                stdout=out,
                stderr=out,
            )
        finally:
            os.close(out)

    def _detached(self, fg: _proc.Popen[str]) -> int | None:
        """Wait for ``-d`` to return, as it does once the daemon has forked away; None (and
        ``-d`` killed) if it does not within start_timeout."""
        code = _wait.wait_child(fg, self.settings.start_timeout)
        if code is None:
            _wait.end_procs([], signal.SIGKILL, children=[fg])
        return code

    def _wait_detached(self, fg: _proc.Popen[str], gpu: GpuInfo, binary: str) -> None:
        """``-d``'s exit code says whether the daemon could start."""
        code = self._detached(fg)
        if code is None:
            raise DaemonError(
                "MPS control daemon did not detach",
                thing=gpu.uuid,
                cause=f"'{binary} -d' still running after {self.settings.start_timeout:g} s",
            )
        if code != 0:
            raise DaemonError(
                "couldn't start MPS",
                thing=f"{gpu.uuid}, pipe {self.dirs.pipe}",
                cause=f"{os.path.basename(binary)} -d exited {code}: "
                f"{_tail(self.dirs.log / START_ERR)}",
                hint="is the NVIDIA driver loaded? run nvidia-smi",
            )

    def _started(
        self,
        gpu: GpuInfo,
        user: _proc.UserIds,
        binary: str,
        cpus: list[int],
        *,
        origin: dict[str, str],
        defaults: Defaults,
    ) -> Manifest:
        """Once detached: wait until it answers, apply the defaults, write the manifest.

        ``origin``: the manifest's node, job_id and started_by.
        """
        daemon = self._wait_ready(gpu)
        applied = self._apply_defaults(defaults, user)
        # A new daemon has a server only if prestarted: otherwise no query (one command less
        # per GPU in the prolog). Servers started later are found in control.log at stop.
        listed = self.control.server_list() if defaults.prestart_server else []
        servers = [p.to_json() for p in map(_proc.identify, listed) if p]
        manifest = Manifest(
            gpu_uuid=gpu.uuid,
            gpu_index=gpu.index,
            gpu_minor=gpu.minor,
            key=self.dirs.key,
            user=user.name,
            uid=user.uid,
            gid=user.gid,
            daemon_pid=daemon.pid,
            daemon_start_time=daemon.start_time,
            cpus=cpus,
            settings=applied,
            servers=servers,
            control_binary=binary,
            node=origin["node"],
            job_id=origin["job_id"],
            started_by=origin["started_by"],
            gpu=gpu.to_json(),
        )
        write_manifest(self.dirs.manifest, manifest, user.uid, user.gid)
        log.info(
            "started MPS daemon pid %d for %s (%s) cpus %s",
            daemon.pid,
            gpu.uuid,
            self.dirs.key,
            _cpu_text(cpus),
        )
        return manifest

    def _wait_ready(self, gpu: GpuInfo) -> _proc.ProcId:
        control = self.control
        for _ in _wait.backoff(self.settings.start_timeout, cap=_wait.POLL_CAP):
            pid = read_pid(self.dirs.pid_file)
            ident = _proc.identify(pid) if pid else None
            if ident and control.ping():
                return ident
        raise DaemonError(
            "MPS control daemon did not answer",
            thing=gpu.uuid,
            cause=f"no reply to get_server_list in {self.settings.start_timeout:g} s"
            f"; control.log: {_tail(self.dirs.control_log)}",
        )

    def _apply_defaults(self, defaults: Defaults, user: _proc.UserIds) -> dict[str, Any]:
        control = self.control
        applied: dict[str, Any] = {}
        if defaults.active_thread_percentage is not None:
            applied["active_thread_percentage"] = control.set_default_active_thread_percentage(
                defaults.active_thread_percentage
            )
        if defaults.pinned_mem_limit:
            # The daemon sees exactly one GPU (its UUID), so the device ordinal is 0.
            control.set_default_pinned_mem_limit("0", defaults.pinned_mem_limit)
            applied["pinned_mem_limit"] = defaults.pinned_mem_limit
        if defaults.client_priority is not None:
            control.set_default_client_priority(defaults.client_priority)
            applied["client_priority"] = defaults.client_priority
        if defaults.prestart_server:
            control.start_server(user.uid)
            applied["prestart_server"] = True
        if defaults.task_threads:
            applied["task_threads"] = defaults.task_threads
        return applied

    def _running(self) -> Manifest | None:
        try:
            manifest = self.manifest()
        except MpswrapError:
            return None
        if manifest and _proc.is_alive(manifest.daemon) and self.control.ping():
            return manifest
        return None

    def _clear_stale(self) -> None:
        """Leftovers of a crashed daemon: stop what the manifest names, remove the dirs."""
        if os.path.lexists(self.dirs.root):  # a symlink planted there is removed too
            report = self._ladder().stop(self._report())
            # A directory that could not be removed holds nothing alive: it is reused.
            if report.leftovers:
                raise DaemonError(
                    "stale MPS processes survive",
                    thing=str(self.dirs.root),
                    cause="; ".join(report.leftovers),
                )

    # --- status -----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        manifest = self.manifest()
        info: dict[str, Any] = {
            "key": self.dirs.key,
            "pipe_dir": str(self.dirs.pipe),
            "log_dir": str(self.dirs.log),
            "uuid": None,
            "daemon": None,
            "servers": [],
            "faults": [],
        }
        if manifest:
            info["uuid"] = manifest.gpu_uuid
            info["daemon"] = {
                "pid": manifest.daemon_pid,
                "alive": _proc.is_alive(manifest.daemon),
                "started_by": manifest.started_by,
                "user": manifest.user,
                "cpus": manifest.cpus,
            }
            info["settings"] = manifest.settings
        from .mpslog import read_faults

        info["faults"] = [f.to_json() for f in read_faults(self.dirs.server_log)]
        if info["daemon"] and info["daemon"]["alive"]:
            info.update(self._live_status(manifest.uid if manifest else None))
        active = {s["pid"] for s in info["servers"] if s["status"] == "ACTIVE"}
        for fault in info["faults"]:  # the live state outranks the log's wording
            fault["recovered"] = fault["recovered"] or fault["server_pid"] in active
        return info

    def _live_status(self, uid: int | None) -> dict[str, Any]:
        control = self.control
        out: dict[str, Any] = {"servers": []}
        try:
            out["default_active_thread_percentage"] = control.default_active_thread_percentage()
            for server, clients in control.clients().items():
                out["servers"].append(
                    {
                        "pid": server,
                        "status": control.server_status(server),
                        "active_thread_percentage": control.active_thread_percentage(server),
                        "clients": [client_status(c, uid) for c in clients],
                    }
                )
        except ControlError as exc:
            out["error"] = exc.line()
        return out

    def clients(self) -> list[int]:
        """The clients of every server of this daemon now (none when it does not answer)."""
        try:
            return [pid for pids in self.control.clients().values() for pid in pids]
        except ControlError:
            return []

    # --- stop -------------------------------------------------------------------------
    def stop(self) -> StopReport:
        """The teardown ladder; harmless when nothing is running or nothing exists."""
        report = self._report()
        if not _there(self.dirs.root):  # a symlink in its place has a ladder too
            return report
        lock = self._lock
        lock.acquire()
        try:  # another hook of the job may have stopped it while we waited: a no-op then
            if _there(self.dirs.root):
                self._stop_ladder().stop(report)
        finally:  # root's lock file goes with the daemon it guarded
            lock.release(remove=not _there(self.dirs.root))
        return report

    def end_clients(self, pids: set[int]) -> StopReport:
        """End those of ``pids`` that are clients here (a rank's ladder): terminate_client,
        and ``shutdown_server -f`` past ``terminate_window`` for a server whose clients are
        all among them; SIGKILL survivors. The safe way to end a busy client: a signal can
        wedge the server."""
        report = self._report()
        self._ladder().end_clients(report, pids)
        return report


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


def _tail(path: Path, lines: int = 3) -> str:
    from .mpslog import LOG_LIMIT

    text = read_job_file(path, LOG_LIMIT, tail=True)
    if text is None:
        return "(no log)"
    return " | ".join(text.strip().splitlines()[-lines:]) or "(empty)"


def _cpu_text(cpus: list[int]) -> str:
    return ",".join(map(str, cpus)) if cpus else "unpinned"
