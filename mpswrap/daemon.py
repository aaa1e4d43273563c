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
import shutil
import signal
import stat
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _proc
from ._lock import file_lock
from .config import Settings
from .control import Control, daemon_env, find_binary
from .errors import ControlError, DaemonError, MpswrapError
from .gpu import GpuInfo
from .manifest import Manifest, read_manifest, write_manifest
from .mpslog import read_faults, server_pids, terminations
from .paths import GpuDirs, ensure_private_dir

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ._lock import FileLock

__all__ = ["Daemon", "Defaults", "StopReport", "finish"]

log = logging.getLogger(__name__)

#: What ``nvidia-cuda-mps-control -d`` printed, in the log directory (read when it fails).
START_ERR = "mpswrap-start.err"


@dataclass(frozen=True)
class Defaults:
    """Settings applied to a daemon before its first client."""

    active_thread_percentage: float | None = None
    pinned_mem_limit: str | None = None
    client_priority: int | None = None
    prestart_server: bool = False

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> Defaults:
        values = {
            "active_thread_percentage": settings.active_thread_percentage,
            "pinned_mem_limit": settings.pinned_mem_limit,
            "client_priority": settings.client_priority,
            "prestart_server": settings.prestart_server,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass
class StopReport:
    key: str
    terminated: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    #: Daemon or server PIDs that needed a signal after quit.
    forced: list[int] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: What server.log said before the directory was removed.
    log_terminations: int = 0
    log_faults: int = 0

    @property
    def clean(self) -> bool:
        return not self.leftovers


class Daemon:
    """The daemon of one GPU directory (``<job>/<key>``), started or found there."""

    def __init__(self, dirs: GpuDirs, lock: Path, settings: Settings) -> None:
        self.dirs = dirs
        self.settings = settings
        self._lock_path = lock

    @functools.cached_property
    def _lock(self) -> FileLock:
        """The start/stop lock, made on first use (start and stop take it; queries do not)."""
        return file_lock(self._lock_path, timeout=self.settings.start_timeout * 4)

    @property
    def control(self) -> Control:
        return Control(
            find_binary(self.settings.control_binary),
            self.dirs.pipe,
            self.dirs.log,
            timeout=self.settings.command_timeout,
        )

    def manifest(self) -> Manifest | None:
        return read_manifest(self.dirs.manifest)

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
        second waits until the daemon answers and returns its manifest (``finish``). A node's
        daemons come up together this way: each launched before the first is waited for.
        Closed in between, it stops what it launched and releases the lock.
        """
        self.dirs.check_socket_length()
        binary = find_binary(self.settings.control_binary)
        with self._lock:
            current = self._running()
            if current is not None:
                log.info("daemon for %s already running (pid %d)", gpu.uuid, current.daemon_pid)
                yield
                return current
            self._clear_stale()
            for path in (self.dirs.root, self.dirs.pipe, self.dirs.log):
                ensure_private_dir(path, user.uid, user.gid)
            launched: _proc.Popen[str] | None = None
            try:
                cpus = self._cpus(gpu, allowed_cpus)
                launched = self._launch(gpu, user, binary, cpus)
                yield
                self._wait_detached(launched, gpu, binary)
                return self._started(
                    gpu,
                    user,
                    binary,
                    cpus,
                    node=node,
                    job_id=job_id,
                    started_by=started_by,
                    defaults=defaults,
                )
            except BaseException:
                if launched is not None and launched.returncode is None:
                    self._detached(launched)  # closed before the second step: reap '-d'
                self._stop_locked(StopReport(self.dirs.key))
                raise

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
        with open(self.dirs.log / START_ERR, "w") as out:
            return _proc.spawn(
                [binary, "-d"], env=env, user=user, cpus=cpus, stdout=out.fileno(),
                stderr=out.fileno(),
            )  # fmt: skip

    def _detached(self, fg: _proc.Popen[str]) -> int | None:
        """Wait for ``-d`` to return, as it does once the daemon has forked away; None (and
        ``-d`` killed) if it does not within start_timeout."""
        try:
            return _proc.wait_child(fg, self.settings.start_timeout)
        except Exception:  # subprocess.TimeoutExpired: _proc owns the subprocess module
            fg.kill()
            fg.wait()
            return None

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
        node: str,
        job_id: str,
        started_by: str,
        defaults: Defaults,
    ) -> Manifest:
        """Once detached: wait until it answers, apply the defaults, write the manifest."""
        daemon = self._wait_ready(gpu)
        applied = self._apply_defaults(defaults, user)
        # A new daemon has a server only if prestarted: otherwise no query (one command less
        # per GPU in the prolog). Servers started later are found in control.log at stop.
        listed = self.control.server_list() if defaults.prestart_server else []
        servers = [p for p in map(_proc.identify, listed) if p]
        manifest = Manifest(
            gpu_uuid=gpu.uuid,
            gpu_index=gpu.index,
            gpu_minor=gpu.minor,
            key=self.dirs.key,
            node=node,
            job_id=job_id,
            user=user.name,
            uid=user.uid,
            gid=user.gid,
            started_by=started_by,
            daemon_pid=daemon.pid,
            daemon_start_time=daemon.start_time,
            cpus=cpus,
            settings=applied,
            servers=[s.to_json() for s in servers],
            control_binary=binary,
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
        for _ in _proc.backoff(self.settings.start_timeout, cap=_proc.POLL_CAP):
            pid = _read_pid(self.dirs.pid_file)
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
        if self.dirs.root.exists():
            report = self._stop_locked(StopReport(self.dirs.key))
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
        info["faults"] = [f.to_json() for f in read_faults(self.dirs.server_log)]
        if info["daemon"] and info["daemon"]["alive"]:
            info.update(self._live_status())
        active = {s["pid"] for s in info["servers"] if s["status"] == "ACTIVE"}
        for fault in info["faults"]:  # the live state outranks the log's wording
            fault["recovered"] = fault["recovered"] or fault["server_pid"] in active
        return info

    def _live_status(self) -> dict[str, Any]:
        control = self.control
        out: dict[str, Any] = {"servers": []}
        try:
            out["default_active_thread_percentage"] = control.default_active_thread_percentage()
            for server in control.server_list():
                out["servers"].append(
                    {
                        "pid": server,
                        "status": control.server_status(server),
                        "active_thread_percentage": control.active_thread_percentage(server),
                        "clients": [
                            {"pid": c, "cmdline": _proc.cmdline(c)}
                            for c in control.client_list(server)
                        ],
                    }
                )
        except ControlError as exc:
            out["error"] = exc.line()
        return out

    # --- stop -------------------------------------------------------------------------
    def stop(self) -> StopReport:
        """The teardown ladder; harmless when nothing is running or nothing exists."""
        report = StopReport(self.dirs.key)
        if not self.dirs.root.exists():
            return report
        with self._lock:
            return self._stop_locked(report)

    def _stop_locked(self, report: StopReport) -> StopReport:
        if any(os.path.islink(p) for p in (self.dirs.root, self.dirs.pipe, self.dirs.log)):
            # Planted by the directory's owner: commands would reach whatever it points at.
            report.leftovers.append(f"symlink in {self.dirs.root}: not followed")
            return report
        try:
            manifest = self.manifest()
        except MpswrapError as exc:
            report.notes.append(exc.line())
            manifest = None
        daemon = manifest.daemon if manifest else _identify_pidfile(self.dirs.pid_file)
        servers = list(manifest.server_ids) if manifest else []
        # Servers started after the manifest (by the first client): named in control.log,
        # trusted only while their environment names this pipe directory.
        logged = server_pids(self.dirs.control_log) - {s.pid for s in servers}
        servers += [p for p in _proc.procs_mentioning(str(self.dirs.pipe)) if p.pid in logged]
        if daemon and _proc.is_alive(daemon):
            servers += self._end_clients(report)
            self._quit(report)
            # quit returns before the server has exited (about 80 ms later on an H100).
            _proc.wait_gone([p for p in [daemon, *servers] if p], self.settings.quit_timeout)
        survivors = self._owned([p for p in [daemon, *servers] if p and _proc.is_alive(p)], report)
        if survivors:
            report.forced += [p.pid for p in survivors]
            _proc.kill_procs(survivors, signal.SIGTERM)
            survivors = _proc.wait_gone(survivors, 1.0)
            _proc.kill_procs(survivors, signal.SIGKILL)
            survivors = _proc.wait_gone(survivors, 2.0)
        report.leftovers += [_proc.describe(p) for p in survivors]
        report.leftovers += [_proc.describe(p) for p in _proc.procs_mentioning(str(self.dirs.pipe))]
        report.log_terminations = terminations(self.dirs.server_log)
        report.log_faults = len(read_faults(self.dirs.server_log))
        self._archive_logs(report)
        if not report.leftovers:
            shutil.rmtree(self.dirs.root, ignore_errors=True)
            if self.dirs.root.exists():
                report.leftovers.append(f"directory {self.dirs.root}")
        return report

    def end_clients(self, pids: set[int], report: StopReport | None = None) -> StopReport:
        """terminate_client those of ``pids`` that are clients here, then SIGKILL survivors.

        The safe way to end a busy client: a signal to it can wedge the server.
        """
        report = report or StopReport(self.dirs.key)
        self._end_clients(report, only=pids)
        return report

    def _archive_logs(self, report: StopReport) -> None:
        """Keep the MPS logs for post-mortems (setting log_archive) before the dirs go."""
        archive = self.settings.log_archive
        if not archive:
            return
        job_dir = self.dirs.root.parent
        prefix = f"{job_dir.parent.name}-{job_dir.name}-{self.dirs.key}"
        try:
            os.makedirs(archive, mode=0o755, exist_ok=True)
            for log_file in (self.dirs.control_log, self.dirs.server_log):
                _copy_regular(log_file, Path(archive) / f"{prefix}-{log_file.name}")
        except OSError as exc:
            report.notes.append(f"cannot archive logs to {archive}: {exc.strerror}")

    def _end_clients(self, report: StopReport, only: set[int] | None = None) -> list[_proc.ProcId]:
        """terminate_client every client (or those in ``only``); SIGKILL those still alive."""
        control = self.control
        try:
            server_pids = control.server_list()
        except ControlError as exc:
            report.notes.append(f"cannot list servers: {exc.cause}")
            return []
        servers = [p for p in map(_proc.identify, server_pids) if p]
        clients: list[_proc.ProcId] = []
        for server in server_pids:
            try:
                pids = control.client_list(server)
            except ControlError as exc:
                report.notes.append(f"cannot list clients of {server}: {exc.cause}")
                continue
            for pid in pids:
                if only is not None and pid not in only:
                    continue
                ident = _proc.identify(pid)
                try:
                    control.terminate_client(server, pid)
                    report.terminated.append(pid)
                except ControlError as exc:
                    report.notes.append(f"terminate_client {pid}: {exc.cause}")
                if ident:
                    clients.append(ident)
        alive = self._owned(_proc.wait_gone(clients, self.settings.terminate_timeout), report)
        if alive:
            _proc.kill_procs(alive, signal.SIGKILL)
            report.killed += [p.pid for p in alive]
            _proc.wait_gone(alive, 2.0)
        return servers

    def _owned(self, procs: list[_proc.ProcId], report: StopReport) -> list[_proc.ProcId]:
        """Only processes of this directory's owner may be signalled: the manifest is that
        user's file, so a PID in it must never make root kill someone else's process."""
        try:
            owner = os.lstat(self.dirs.root).st_uid
        except OSError:
            return []
        mine = [p for p in procs if _proc.uid_of(p) in (owner, None)]
        report.notes += [f"not signalling {p.pid}: not uid {owner}" for p in procs if p not in mine]
        return mine

    def _quit(self, report: StopReport) -> None:
        try:
            self.control.quit(force_after=self.settings.quit_timeout)
        except ControlError as exc:
            report.notes.append(f"quit: {exc.cause}")


def finish(steps: Generator[None, None, Manifest]) -> Manifest:
    """The second step of ``Daemon.starting``: its manifest."""
    try:
        next(steps)
    except StopIteration as done:
        manifest: Manifest = done.value
        return manifest
    raise AssertionError("Daemon.starting yields once")  # pragma: no cover


def _copy_regular(src: Path, dest: Path) -> None:
    """Copy src only if it is a regular file itself: the job user owns the log directory
    and could put a symlink to any file of root's there."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return
    with os.fdopen(fd, "rb") as source:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            with open(dest, "wb") as out:
                shutil.copyfileobj(source, out)


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _identify_pidfile(path: Path) -> _proc.ProcId | None:
    """A daemon without manifest (crashed start), trusted only if its environment names this
    pipe directory: a stale pid file may name a PID that an unrelated process reuses."""
    pid = _read_pid(path)
    if not pid:
        return None
    return next((p for p in _proc.procs_mentioning(str(path.parent)) if p.pid == pid), None)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty)"


def _cpu_text(cpus: list[int]) -> str:
    return ",".join(map(str, cpus)) if cpus else "unpinned"
