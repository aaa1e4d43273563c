"""The per-GPU manifest: what was started, by whom, with which settings.

Teardown trusts only the manifest's PID *and* start time, so a daemon is never stopped by
name or through a PID that an unrelated process has since reused. The manifest lies in a
directory the job's user owns: it is read through ``read_job_file`` (a regular file of at
most ``MANIFEST_LIMIT`` bytes) and written through ``write_job_file``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .. import fields
from .._proc import ProcId
from .._struct import Struct, asdict, field
from ..errors import DaemonError
from ..paths import read_job_file, write_job_file

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = ["MANIFEST_LIMIT", "MANIFEST_VERSION", "Manifest", "read_manifest", "write_manifest"]

MANIFEST_VERSION = 1
#: A manifest is about 1 KiB; a larger file is not one of ours.
MANIFEST_LIMIT = 64 << 10


class Manifest(Struct):
    gpu_uuid: str
    gpu_index: int
    gpu_minor: int
    key: str
    node: str
    job_id: str
    user: str
    uid: int
    gid: int
    started_by: str  # "prolog" | "user" | "cli"
    daemon_pid: int
    daemon_start_time: float
    cpus: list[int] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    servers: list[dict[str, float]] = field(default_factory=list)
    control_binary: str = ""
    #: The GPU as its starter's NVML saw it (GpuInfo.to_json): a rank that joins the daemons
    #: takes CPUs and memory from here instead of loading NVML (empty in older manifests).
    gpu: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    version: int = MANIFEST_VERSION

    @property
    def daemon(self) -> ProcId:
        return ProcId(self.daemon_pid, self.daemon_start_time)

    @property
    def server_ids(self) -> list[ProcId]:
        return [ProcId(int(s["pid"]), float(s["start_time"])) for s in self.servers]

    @classmethod
    def checked(cls, data: dict[str, Any]) -> Manifest:
        """A manifest from its JSON form, every field of its declared type (``fields``):
        the job user writes this file, and a value of another type is a FieldError here,
        never an exception where it is used."""
        servers = [
            {"pid": fields.pid(s["pid"]), "start_time": fields.number(s["start_time"])}
            for s in fields.items(data.get("servers", []), 256)
        ]
        return cls(
            gpu_uuid=fields.text(data["gpu_uuid"], 256),
            gpu_index=fields.whole(data["gpu_index"]),
            key=fields.text(data["key"], 8),
            node=fields.text(data["node"], 256),
            job_id=fields.text(data["job_id"], 256),
            user=fields.text(data["user"], 256),
            uid=fields.whole(data["uid"]),
            gid=fields.whole(data["gid"]),
            started_by=fields.text(data["started_by"], 16),
            gpu_minor=_minor(data["gpu_minor"]),
            daemon_pid=fields.pid(data["daemon_pid"]),
            daemon_start_time=fields.number(data["daemon_start_time"]),
            cpus=[fields.whole(c, 1 << 16) for c in fields.items(data.get("cpus", []))],
            settings=_mapping(data.get("settings", {})),
            servers=servers,
            control_binary=fields.text(data.get("control_binary", "")),
            gpu=_mapping(data.get("gpu", {})),
            created=fields.number(data.get("created", 0)),
            version=fields.whole(data["version"]),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)


def _minor(value: object) -> int:
    """A device minor number, or -1 where the inventory had none."""
    return -1 if value == -1 else fields.whole(value)


def _mapping(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fields.FieldError(f"expected a mapping, got {type(value).__name__}")
    return value


def read_manifest(path: Path) -> Manifest | None:
    """The manifest at ``path``, None if absent (or no regular file: ``read_job_file`` warns);
    a corrupt or future one is an error."""
    text = read_job_file(path, MANIFEST_LIMIT)
    if text is None:
        return None
    try:
        data = fields.json_value(text)
    except fields.FieldError as exc:
        raise DaemonError("unreadable manifest", thing=str(path), cause=str(exc)) from exc
    if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
        raise DaemonError(
            "unsupported manifest version",
            thing=str(path),
            cause=f"version {data.get('version') if isinstance(data, dict) else '?'}",
            hint="stop it with the mpswrap version that started it",
        )
    try:
        return Manifest.checked(data)
    except (ValueError, KeyError, TypeError) as exc:  # FieldError is a ValueError
        cause = f"field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise DaemonError("malformed manifest", thing=str(path), cause=cause) from exc


def write_manifest(path: Path, manifest: Manifest, uid: int, gid: int) -> None:
    """Write atomically (temp file + rename) so readers never see half a manifest."""
    write_job_file(path, manifest.to_json() + "\n", uid, gid)
