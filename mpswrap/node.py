"""The daemons of one job on one node: start a set of GPUs, report, stop them all.

Shared by the CLI (``mpswrap start|stop|status``), the Slurm hooks, the launcher and
``session()``, so every entry point starts and tears down the same way.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _proc
from .config import Settings
from .daemon import Daemon, Defaults, StopReport, finish
from .errors import DaemonError, LayoutError
from .gpu import GpuInfo
from .manifest import Manifest
from .paths import JobLayout, default_user_run_dir

__all__ = ["JobDaemons", "user_layout"]

log = logging.getLogger(__name__)


def user_layout(
    settings: Settings,
    node: str,
    job_id: str,
    uid: int | None = None,
    env: dict[str, str] | None = None,
) -> JobLayout:
    """Layout for user mode: ``user_run_dir`` or the per-user default."""
    run_dir = settings.user_run_dir or default_user_run_dir(uid, env)
    return JobLayout(Path(run_dir), node, job_id)


@dataclass
class JobDaemons:
    """All per-GPU daemons of ``layout`` (one job on one node)."""

    layout: JobLayout
    settings: Settings

    def daemon(self, key: str) -> Daemon:
        return Daemon(self.layout.gpu(key), self.layout.lock_path(key), self.settings)

    def keys(self) -> list[str]:
        return [d.key for d in self.layout.existing_gpus()]

    def manifests(self) -> list[Manifest]:
        out = []
        for key in self.keys():
            manifest = self.daemon(key).manifest()
            if manifest:
                out.append(manifest)
        return out

    def start(
        self,
        gpus: Sequence[GpuInfo],
        user: _proc.UserIds,
        *,
        started_by: str,
        defaults: Defaults,
        shared_parents: bool,
        keys: Sequence[str] | None = None,
        allowed_cpus: frozenset[int] | None = None,
    ) -> list[Manifest]:
        """Start one daemon per GPU (``keys[i]`` or ``g<i>``); on any failure stop them all.

        All are launched before the first is waited for, so they come up together: the
        time grows with the GPU count only by what each costs once it answers.
        """
        keys = list(keys) if keys else [f"g{i}" for i in range(len(gpus))]
        for key in keys:  # before creating anything: a bad layout must leave nothing behind
            self.layout.gpu(key).check_socket_length()
        self.layout.create(user.uid, user.gid, shared_parents=shared_parents)
        pending = []
        try:
            for key, gpu in zip(keys, gpus):
                steps = self.daemon(key).starting(
                    gpu,
                    user,
                    node=self.layout.node,
                    job_id=self.layout.job_id,
                    started_by=started_by,
                    defaults=defaults,
                    allowed_cpus=allowed_cpus,
                )
                next(steps)  # launched, its lock held
                pending.append(steps)
            return [finish(steps) for steps in pending]
        except BaseException:
            for steps in pending:  # stop what is half started and release its lock first
                steps.close()
            self.stop()
            raise

    def status(self) -> dict[str, Any]:
        return {
            "node": self.layout.node,
            "job": self.layout.job_id,
            "job_dir": str(self.layout.job_dir),
            "gpus": [self.daemon(key).status() for key in self.keys()],
        }

    def stop(self, only_started_by: str | None = None) -> list[StopReport]:
        """Run the ladder for every GPU, then remove the job directory if nothing survived."""
        reports = []
        for key in self.keys():
            daemon = self.daemon(key)
            manifest = _safe_manifest(daemon)
            if only_started_by and manifest and manifest.started_by != only_started_by:
                continue
            reports.append(daemon.stop())
        if all(r.clean for r in reports) and not self.keys():
            self._remove_job_dir()
        return reports

    def _remove_job_dir(self) -> None:
        job_dir = self.layout.job_dir
        if not job_dir.exists():
            return
        shutil.rmtree(job_dir, ignore_errors=True)
        for parent in (self.layout.node_dir,):
            try:
                parent.rmdir()  # only if empty: other jobs may share it
            except OSError:
                pass


def _safe_manifest(daemon: Daemon) -> Manifest | None:
    try:
        return daemon.manifest()
    except DaemonError:
        return None


def check_run_dir_writable(layout: JobLayout) -> None:
    """Fail early with a clear error when run_dir cannot be created or written."""
    probe = layout.run_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK):
        raise LayoutError(
            "run directory not writable",
            thing=str(layout.run_dir),
            cause=f"{probe} is not writable by uid {os.geteuid()}",
            hint="set run_dir / user_run_dir, or MPSWRAP_USER_RUN_DIR",
        )
