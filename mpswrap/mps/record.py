"""The record of one job's GPU daemon, kept with its logs under ``log_archive`` when the
teardown removes the daemon's directory: who ran what on which GPU, which clients connected,
how each was ended, the faults the server named, what was left. ``mpswrap report JOB`` reads
it. Records and logs older than ``log_archive_days`` are removed by the next teardown that
writes one.

Files: ``<archive>/<node>-<job>-<gpu key>-{control.log,server.log,record.json}``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..paths import GpuDirs
from .manifest import Manifest
from .mpslog import Fault, GpuLogs

__all__ = ["FIELDS", "SUFFIX", "origin_of", "prune", "read_records", "record_of", "write_record"]

log = logging.getLogger(__name__)

SUFFIX = "-record.json"
LIMIT = 4096  # clients and faults kept per record: a record stays under a few hundred KiB
#: The names mpswrap writes in an archive (``prune`` removes no other file).
OURS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*-g[0-9]{1,3}-(control\.log|server\.log|record\.json)")
STAMP = ".mpswrap-pruned"
#: The fields of a record (``mpswrap report JOB --json``), as docs/reference.md lists them.
FIELDS = {
    "node": "the node",
    "job": "the job id",
    "gpu": "the job's GPU key (g0, g1, ...)",
    "gpu_uuid": "the GPU's UUID",
    "user": "the user the daemon ran as",
    "started_by": "prolog, user (mpswrap's launcher) or cli (mpswrap start)",
    "daemon_started": "when the daemon started, seconds since the epoch",
    "stopped": "when the teardown wrote the record",
    "clients_seen": "PIDs of the clients that connected (control.log), at most 4096",
    "clients_seen_count": "how many connected",
    "ended_by_terminate_client": "clients the teardown ended with terminate_client",
    "ended_with_server": "clients ended with their server (shutdown_server -f)",
    "servers_shut_down": "server PID -> clients it had when shut down",
    "killed": "clients that needed SIGKILL",
    "terminations_logged": "'Client termination succeeded' lines in server.log",
    "leftovers": "what survived the teardown",
    "faults": "fatal faults in server.log: time, server PID, the PIDs it named, recovered",
}
PRUNE_EVERY = 3600.0  # seconds: one scan of a large shared archive per hour, not per GPU
#: The fields of a record that say who ran what (``origin_of``).
ORIGIN = ("gpu_uuid", "user", "started_by", "daemon_started")


def origin_of(manifest: Manifest | None) -> dict[str, Any]:
    """Who ran what, as a manifest says it (user mode; root takes its own record's)."""
    return {
        "gpu_uuid": manifest.gpu_uuid if manifest else None,
        "user": manifest.user if manifest else None,
        "started_by": manifest.started_by if manifest else None,
        "daemon_started": manifest.created if manifest else None,
    }


def record_of(
    dirs: GpuDirs,
    origin: dict[str, Any],
    ended: dict[str, Any],
    logs: GpuLogs,
    faults: list[Fault],
) -> dict[str, Any]:
    """What the teardown of ``dirs`` leaves on record (before the directory goes): ``origin``
    (``origin_of``: the GPU, user, starter and start), ``ended``: how the teardown ended
    clients and servers (``StopReport.ended``), and what its logs said (``logs``, as the
    teardown read them once, and their ``faults``, as it found them once)."""
    job_dir = dirs.root.parent
    seen = logs.control.clients_seen()
    return {
        "node": job_dir.parent.name,
        "job": job_dir.name,
        "gpu": dirs.key,
        **{name: origin.get(name) for name in ORIGIN},
        "stopped": round(time.time(), 3),
        "clients_seen": seen[:LIMIT],
        "clients_seen_count": len(seen),
        **{k: v[:LIMIT] if isinstance(v, list) else v for k, v in ended.items()},
        "faults": [f.to_json() for f in faults][:LIMIT],
    }


def write_record(archive: Path, prefix: str, record: dict[str, Any]) -> Path:
    """``<archive>/<prefix>-record.json``, written whole (a new file renamed over it)."""
    target = archive / f"{prefix}{SUFFIX}"
    tmp = archive / f".{prefix}{SUFFIX}.{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with open(fd, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def prune(archive: Path, days: float | None) -> None:
    """Remove mpswrap's records and logs older than ``days`` from ``archive``: only names
    mpswrap writes (``OURS``), never through a link, at most once an hour (a stamp file)."""
    if days is None or not _due(archive):
        return
    cutoff = time.time() - days * 86400
    for entry in os.scandir(archive):
        if not OURS.fullmatch(entry.name):
            continue
        try:
            if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < cutoff:
                os.unlink(entry.path)
        except OSError as exc:
            log.debug("not pruned %s: %s", entry.path, exc)


def _due(archive: Path) -> bool:
    """Whether an hour passed since the last prune; the stamp is renewed when it did."""
    fd = os.open(archive / STAMP, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        st = os.fstat(fd)
        if 0 < time.time() - st.st_mtime < PRUNE_EVERY and st.st_size:
            return False
        os.pwrite(fd, b"1", 0)
        os.utime(fd)
        return True
    finally:
        os.close(fd)


def _unreadable(path: Path, exc: OSError) -> ConfigError:
    return ConfigError(
        "cannot read the teardowns' records",
        thing=str(path),
        cause=exc.strerror or str(exc),
        hint="log_archive is root's: ask root, or run mpswrap report as root",
    )


def read_records(archive: Path, job: str) -> list[dict[str, Any]]:
    """The records of ``job`` in ``archive``, one per node and GPU, by node and GPU. An
    archive, or a record of the job, this user may not read is a ConfigError (not "no
    record"): an archive that does not exist holds none."""
    try:
        names = os.listdir(archive)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise _unreadable(archive, exc) from None
    found = []
    pattern = re.compile(rf".*-{re.escape(job)}-.*{re.escape(SUFFIX)}")
    for path in sorted(archive / name for name in names if pattern.fullmatch(name)):
        try:
            data = json.loads(path.read_text())
        except PermissionError as exc:
            raise _unreadable(path, exc) from None
        except (OSError, ValueError):
            data = None
        # Every field present: a record of another version, or damaged, is passed over, and
        # said (a user asking for the job's record learns it is there but unreadable).
        if not isinstance(data, dict) or not FIELDS.keys() <= data.keys():
            log.warning("passed over %s: not a record this mpswrap reads", path)
        elif data.get("job") == job:  # not another job's whose id the name holds too
            found.append(data)
    # By node and GPU: a job's GPUs stop side by side, in no order of their own.
    return sorted(
        found, key=lambda r: (str(r.get("node")), str(r.get("gpu")), r.get("stopped") or 0)
    )
