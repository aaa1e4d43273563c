"""Attach ranks to a job's daemons: the prolog's if there are any, else user-mode ones.

User-mode ownership: the first local rank starts the daemons under the job's lock; every
owner (a per-rank supervisor, ``mpswrap run``, or a ``session()`` process) holds a reference
file ``refs/<pid>-<start time>``; the last owner to release stops the daemons. A small
watchdog stops them when every owner has died without releasing (``MPI_Abort``, SIGKILL);
the Slurm epilog sweeps whatever is still left.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _lock, _proc
from .config import Settings, load_settings
from .daemon import Defaults, StopReport
from .errors import GpuError, MpswrapError
from .gpu import (
    GpuInfo,
    default_gres_conf,
    load_inventory,
    resolve_gpus,
    resolve_gres_positions,
)
from .jobenv import JobEnv
from .manifest import Manifest
from .node import JobDaemons, check_run_dir_writable, user_layout
from .paths import JobLayout

__all__ = ["Attachment", "attach", "job_id_of", "release", "visible_gpus"]

log = logging.getLogger(__name__)

WATCHDOG_PID = "watchdog.pid"
OWNER_LOCK = ".owner.lock"
#: How often the watchdog looks at the owners, and how long all must be gone before it acts.
WATCH_INTERVAL = 0.5
WATCH_GRACE = 2.0
_WATCHDOGS: list[Any] = []


@dataclass
class Attachment:
    """The daemons a rank may use, and how this process holds them."""

    layout: JobLayout
    manifests: list[Manifest]
    mode: str  # "prolog" (admin daemons, never stopped by us) or "user"
    settings: Settings
    ref: Path | None = None
    reports: list[StopReport] = field(default_factory=list)

    def dirs_for(self, position: int) -> tuple[Manifest, Path]:
        manifest = self.manifests[position]
        return manifest, self.layout.gpu(manifest.key).root


def job_id_of(env: JobEnv) -> str:
    """A job id shared by every rank on a node: Slurm's, the launcher's, or ``local``."""
    return (
        env.env.get("MPSWRAP_JOB")
        or env.job_id
        or env.env.get("PMIX_NAMESPACE", "").replace("/", "-")[:60]
        or "local"
    )


def visible_gpus(env: JobEnv, settings: Settings) -> list[GpuInfo]:
    """The GPUs this step may use: Slurm's gres positions, else CUDA_VISIBLE_DEVICES, else all."""
    inventory = load_inventory(settings.gpu_inventory)
    positions = env.step_gpus
    if positions:
        return resolve_gres_positions(positions, inventory, default_gres_conf(env.env), env.node)
    cvd = env.env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() in ("", "-1", "NoDevFiles"):
        raise GpuError("CUDA_VISIBLE_DEVICES hides every GPU", thing=repr(cvd))
    return resolve_gpus(cvd or "all", inventory)


def _live(manifests: list[Manifest]) -> bool:
    return bool(manifests) and all(_proc.is_alive(m.daemon) for m in manifests)


def attach(
    settings: Settings,
    env: JobEnv,
    *,
    defaults: Defaults | None = None,
    gpus: list[GpuInfo] | None = None,
) -> Attachment:
    """Find the prolog's daemons for this job, or start/join user-mode ones."""
    job, node = job_id_of(env), env.node
    admin = JobDaemons(JobLayout(Path(settings.run_dir), node, job), settings)
    if admin.layout.job_dir.exists():
        manifests = admin.manifests()
        if _live(manifests):
            return Attachment(admin.layout, manifests, "prolog", settings)
    layout = user_layout(settings, node, job)
    check_run_dir_writable(layout)
    user = _proc.lookup_user()
    gpus = gpus if gpus is not None else visible_gpus(env, settings)  # before creating dirs
    layout.create(user.uid, user.gid, shared_parents=False)
    with _lock.file_lock(layout.job_dir / OWNER_LOCK, timeout=settings.start_timeout * 4):
        manifests = JobDaemons(layout, settings).start(
            gpus,
            user,
            started_by="user",
            defaults=defaults or Defaults.from_settings(settings),
            shared_parents=False,
        )
        ref = _add_ref(layout)
        _ensure_watchdog(layout)
    return Attachment(layout, manifests, "user", settings, ref)


def release(att: Attachment) -> list[StopReport]:
    """Drop this owner's reference; the last owner stops the user-mode daemons."""
    if att.mode != "user" or att.ref is None:
        return []
    lock = att.layout.job_dir / OWNER_LOCK
    if not att.layout.job_dir.exists():
        return []
    with _lock.file_lock(lock, timeout=30):
        att.ref.unlink(missing_ok=True)
        att.ref = None
        if _live_refs(att.layout):
            return []
        att.reports = JobDaemons(att.layout, att.settings).stop()
    return att.reports


def _add_ref(layout: JobLayout) -> Path:
    me = _proc.identify(os.getpid())
    assert me is not None
    layout.refs_dir.mkdir(mode=0o700, exist_ok=True)
    ref = layout.refs_dir / f"{me.pid}-{me.start_time:.3f}"
    ref.touch()
    return ref


def _live_refs(layout: JobLayout) -> list[Path]:
    """References whose owner still runs (same PID and start time); stale ones are removed."""
    live = []
    try:
        refs = list(layout.refs_dir.iterdir())
    except FileNotFoundError:
        return []
    for ref in refs:
        owner = _owner_of(ref)
        if owner is None:
            continue
        if _proc.is_alive(owner):
            live.append(ref)
        else:
            ref.unlink(missing_ok=True)
    return live


def _owner_of(ref: Path) -> _proc.ProcId | None:
    pid_text, _, start_text = ref.name.partition("-")
    try:
        return _proc.ProcId(int(pid_text), float(start_text))
    except ValueError:
        return None


def _ensure_watchdog(layout: JobLayout) -> None:
    pid_file = layout.job_dir / WATCHDOG_PID
    try:
        pid_text, _, start_text = pid_file.read_text().partition(" ")
        if _proc.is_alive(_proc.ProcId(int(pid_text), float(start_text))):
            return
    except (OSError, ValueError):
        pass
    argv = [sys.executable, "-m", "mpswrap.owner", str(layout.job_dir)]
    env = {k: v for k, v in os.environ.items() if k.startswith(("MPSWRAP_", "PATH", "HOME"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    # stdio away from the caller's: srun and test runners wait for EOF on their pipes.
    child = _proc.spawn(
        argv, env=env, stdout=_proc.DEVNULL, stderr=_proc.DEVNULL, ignore_signals=_proc.SHIELDED
    )
    _WATCHDOGS.append(child)  # keep the Popen: it outlives this call by design
    ident = _proc.identify(child.pid)
    if ident:
        pid_file.write_text(f"{ident.pid} {ident.start_time}")


def watchdog(job_dir: Path) -> int:
    """Stop the user-mode daemons of ``job_dir`` once every owner has gone."""
    layout = JobLayout(job_dir.parent.parent, job_dir.parent.name, job_dir.name)
    settings = load_settings()
    gone_since: float | None = None
    daemons: list[_proc.ProcId] = []
    owners: list[_proc.ProcId] = []
    while layout.job_dir.exists():
        daemons = _daemons_of(layout, settings) or daemons
        live = _live_refs(layout)
        owners = [o for o in map(_owner_of, live) if o] or owners
        if live:
            gone_since = None
        elif gone_since is None:
            gone_since = time.monotonic()
        elif time.monotonic() - gone_since >= WATCH_GRACE:
            with _lock.file_lock(job_dir / OWNER_LOCK, timeout=30):
                if not _live_refs(layout):
                    JobDaemons(layout, settings).stop()
                    return 0
        time.sleep(WATCH_INTERVAL)
    # The last owner's stop removes the directory once the daemons are gone. If some still
    # run, it went away under them (a tmp cleaner, a logout removing $XDG_RUNTIME_DIR): once
    # the owners we saw are gone too, end them by identity.
    daemons = [d for d in daemons if _proc.is_alive(d)]
    while daemons and any(_proc.is_alive(o) for o in owners):
        time.sleep(WATCH_INTERVAL)
    _kill_orphaned(daemons)
    return 0


def _daemons_of(layout: JobLayout, settings: Settings) -> list[_proc.ProcId]:
    """The job's daemons by identity, while their manifests can still be read."""
    try:
        manifests = JobDaemons(layout, settings).manifests()
    except MpswrapError:
        return []
    return [_proc.ProcId(m.daemon_pid, m.daemon_start_time) for m in manifests]


def _kill_orphaned(daemons: list[_proc.ProcId]) -> None:
    """No socket is left to quit them through: kill the daemons and their servers."""
    for daemon in (d for d in daemons if _proc.is_alive(d)):
        servers = _proc.children_of(daemon.pid)
        log.warning("job directory gone: killing MPS daemon %d and servers %s",
                    daemon.pid, [s.pid for s in servers])  # fmt: skip
        _proc.kill_procs([daemon, *servers], signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(watchdog(Path(sys.argv[1])))
