"""Starting one GPU's MPS control daemon: the defaults it gets, and the start itself.

A start (its lock held by ``Daemon.starting``): as root, the daemon's cgroup and root's record
naming it first (``rootrecord``); ``nvidia-cuda-mps-control -d`` spawned fully detached as the
job user with ``CUDA_VISIBLE_DEVICES=<UUID>``, pinned near its GPU, in that cgroup; readiness
by a real control query with bounded backoff; defaults applied before any client; the
manifest (the user's, for ranks and user mode) and root's record with the daemon it found.
As root the daemon is the process the kernel names (the one of its cgroup, or without one a
child of ours since ``adopt_orphans``); the pid file the job user can write only points at it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

from .. import _proc, _wait
from .._cgroup import Cgroup, member_of
from .._struct import Struct, replace
from ..config import Settings
from ..errors import DaemonError
from ..paths import GpuDirs, create_job_file, read_job_file
from .control import Control, daemon_env, read_pid
from .gpu import GpuInfo
from .manifest import Manifest, write_manifest
from .rootrecord import Held, RootSide, pin_control, write_held

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = ["Defaults", "Start", "log_started"]

log = logging.getLogger(__name__)

#: What ``nvidia-cuda-mps-control -d`` printed, in the log directory (read when it fails).
START_ERR = "mpswrap-start.err"
_SAID: set[str] = set()


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


class Start(Struct):
    """One start of the daemon of ``dirs`` for ``gpu`` as ``user``."""

    dirs: GpuDirs
    gpu: GpuInfo
    user: _proc.UserIds
    binary: str
    control: Control
    settings: Settings
    cpus: list[int]
    #: The manifest's node, job_id and started_by.
    origin: dict[str, str]
    defaults: Defaults
    #: Root's own state of the daemon; None in user mode.
    root: RootSide | None = None
    #: Root's record of this start (root only), once ``launch`` wrote it.
    held: Held | None = None

    def launch(self) -> _proc.Popen[str]:
        """As root, the cgroup and the record first; then ``nvidia-cuda-mps-control -d`` as
        the user on ``cpus``, in that cgroup, not waited for."""
        began = time.monotonic()
        cgroup = self._hold()
        held = time.monotonic()
        env = daemon_env(
            self.dirs.pipe,
            self.dirs.log,
            {"CUDA_VISIBLE_DEVICES": self.gpu.uuid, "HOME": self.user.home, "USER": self.user.name},
        )
        if self.root is not None and cgroup is None:
            _proc.adopt_orphans()  # the daemon '-d' forks becomes our child: ``_ours``
        out = create_job_file(self.dirs.log / START_ERR)  # root's, in the user's directory
        try:
            launched = _proc.spawn(
                [self.binary, "-d"],
                env=env,
                user=self.user,
                cpus=self.cpus,
                stdout=out,
                stderr=out,
                cgroup=str(cgroup.path) if cgroup else None,
            )
        finally:
            os.close(out)
        log.debug(
            "%s: cgroup and record in %.0f ms, '-d' launched %.0f ms later",
            self.dirs.key,
            (held - began) * 1000,
            (time.monotonic() - held) * 1000,
        )
        return launched

    def _hold(self) -> Cgroup | None:
        """As root, before the daemon starts: its cgroup, and root's record naming it."""
        if self.root is None:
            return None
        cgroup = self._cgroup()
        self.held = Held(
            self.dirs.key,
            self.gpu.uuid,
            self.user.uid,
            self.user.gid,
            self.user.name,
            self.origin["started_by"],
            cgroup=str(cgroup.path) if cgroup else None,
            cpus=self.cpus,
        )
        write_held(self.root.record, self.held)
        return cgroup

    def _cgroup(self) -> Cgroup | None:
        """The daemon's cgroup, made; None (said once per process) where root may make none."""
        assert self.root is not None
        if self.root.cgroup is None:
            return None
        try:
            return self.root.cgroup.make()
        except (OSError, ValueError) as exc:
            where = self.root.cgroup.path.parent.parent  # the cgroup_root setting's folder
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            _say_once(
                f"no cgroup for the MPS daemons in {where} ({why}): root knows each by its "
                "record (PID and start time) and its process tree"
            )
            return None

    def finish(self, launched: _proc.Popen[str]) -> Manifest:
        """Once launched: ``-d`` returned, the daemon answers, the defaults are applied, the
        manifest and root's record name it."""
        began = time.monotonic()
        self._wait_detached(launched)
        detached = time.monotonic()
        daemon = self._wait_ready()
        ready = time.monotonic()
        applied = self._apply_defaults()
        # A new daemon has a server only if prestarted: otherwise no query (one command less
        # per GPU in the prolog). Servers started later are its children.
        listed = self.control.server_list() if self.defaults.prestart_server else []
        manifest = self._manifest(daemon, applied, [p for p in map(_proc.identify, listed) if p])
        write_manifest(self.dirs.manifest, manifest, self.user.uid, self.user.gid)
        if self.root is not None and self.held is not None:
            pinned = None
            if self.root.control is not None:
                pinned = pin_control(self.dirs.pipe, self.root.control, self.user.uid, daemon.pid)
            pin, socket = pinned or ("", None)
            self.held = replace(self.held, daemon=daemon, settings=applied, pin=pin, socket=socket)
            write_held(self.root.record, self.held)
        log.debug(
            "%s: '-d' returned in %.0f ms, the daemon answered %.0f ms later, defaults, "
            "manifest and record %.0f ms",
            self.dirs.key,
            (detached - began) * 1000,
            (ready - detached) * 1000,
            (time.monotonic() - ready) * 1000,
        )
        return manifest

    def _manifest(
        self, daemon: _proc.ProcId, applied: dict[str, Any], servers: list[_proc.ProcId]
    ) -> Manifest:
        return Manifest(
            gpu_uuid=self.gpu.uuid,
            gpu_index=self.gpu.index,
            gpu_minor=self.gpu.minor,
            key=self.dirs.key,
            user=self.user.name,
            uid=self.user.uid,
            gid=self.user.gid,
            daemon_pid=daemon.pid,
            daemon_start_time=daemon.start_time,
            cpus=self.cpus,
            settings=applied,
            servers=[p.to_json() for p in servers],
            control_binary=self.binary,
            node=self.origin["node"],
            job_id=self.origin["job_id"],
            started_by=self.origin["started_by"],
            gpu=self.gpu.to_json(),
        )

    def detached(self, fg: _proc.Popen[str]) -> int | None:
        """Wait for ``-d`` to return, as it does once the daemon has forked away; None (and
        ``-d`` killed) if it does not within start_timeout."""
        code = _wait.wait_child(fg, self.settings.start_timeout)
        if code is None:
            _wait.end_procs([], signal.SIGKILL, children=[fg])
        return code

    def _wait_detached(self, fg: _proc.Popen[str]) -> None:
        """``-d``'s exit code says whether the daemon could start."""
        code = self.detached(fg)
        if code is None:
            raise DaemonError(
                "MPS control daemon did not detach",
                thing=self.gpu.uuid,
                cause=f"'{self.binary} -d' still running after {self.settings.start_timeout:g} s",
            )
        if code != 0:
            raise DaemonError(
                "couldn't start MPS",
                thing=f"{self.gpu.uuid}, pipe {self.dirs.pipe}",
                cause=f"{os.path.basename(self.binary)} -d exited {code}: "
                f"{tail(self.dirs.log / START_ERR)}",
                hint="is the NVIDIA driver loaded? run nvidia-smi",
            )

    def _wait_ready(self) -> _proc.ProcId:
        for _ in _wait.backoff(self.settings.start_timeout, cap=_wait.POLL_CAP):
            pid = read_pid(self.dirs.pid_file)
            ident = _proc.identify(pid) if pid and self._ours(pid) else None
            if ident and self.control.ping():
                return ident
        raise DaemonError(
            "MPS control daemon did not answer",
            thing=self.gpu.uuid,
            cause=f"no reply to get_server_list in {self.settings.start_timeout:g} s"
            f"; control.log: {tail(self.dirs.control_log)}",
        )

    def _ours(self, pid: int) -> bool:
        """As root, whether the pid file's PID is the daemon just launched: a process of its
        cgroup, or without one a child of ours (``adopt_orphans``). The pid file is the job
        user's; the kernel says which process is the daemon."""
        if self.root is None or self.held is None:
            return True
        if self.held.cgroup:
            return Cgroup(Path(self.held.cgroup)).holds(member_of(pid))
        return _proc.parent_of(pid) == os.getpid()

    def _apply_defaults(self) -> dict[str, Any]:
        control, defaults = self.control, self.defaults
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
            control.start_server(self.user.uid)
            applied["prestart_server"] = True
        if defaults.task_threads:
            applied["task_threads"] = defaults.task_threads
        return applied


def tail(path: Path, lines: int = 3) -> str:
    """The last lines of a log in the job's directories, for a message."""
    from .mpslog import LOG_LIMIT

    text = read_job_file(path, LOG_LIMIT, tail=True)
    if text is None:
        return "(no log)"
    return " | ".join(text.strip().splitlines()[-lines:]) or "(empty)"


def cpu_text(cpus: list[int]) -> str:
    return ",".join(map(str, cpus)) if cpus else "unpinned"


def log_started(manifest: Manifest) -> None:
    """The line that says a daemon started (once each of a node's GPUs has started or failed,
    in GPU order)."""
    log.info(
        "started MPS daemon pid %d for %s (%s) cpus %s",
        manifest.daemon_pid,
        manifest.gpu_uuid,
        manifest.key,
        cpu_text(manifest.cpus),
    )


def _say_once(line: str) -> None:
    """A warning a process gives once, however many daemons it starts."""
    if line not in _SAID:
        _SAID.add(line)
        log.warning("%s", line)
