"""``mpswrap metrics``: the node's MPS daemons, servers and clients in the Prometheus text
exposition format (version 0.0.4), printed, or written for node_exporter's textfile collector
(``--textfile DIR``: ``DIR/mpswrap.prom``, replaced whole, so a scrape never reads half of it).

Written by hand, not with prometheus_client: the format is small and fixed, and the hooks and
the CLI stay without a further dependency; the tests parse the output with prometheus_client.
A job's series carry ``node``, ``job``, ``user``, ``gpu_uuid``, ``gpu`` (the job's GPU key) and
``job_dir`` (two directories of one job id, a prolog's and a user's, stay two series); client
series add ``pid`` and ``rank`` (empty where the client's environment names none or may not
be read). A GPU's own figures are given once per GPU (``node``, ``gpu_uuid``), however many
jobs share it. A series written twice would make node_exporter refuse the whole scrape: the
first is kept. docs/reference.md lists the series.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import UsageError

__all__ = ["FAMILIES", "render", "write_textfile"]

#: name, type, help: the families ``render`` writes, in this order.
FAMILIES = (
    ("mpswrap_jobs", "gauge", "MPS jobs of mpswrap on this node"),
    ("mpswrap_daemon_up", "gauge", "1 while the GPU's MPS control daemon runs"),
    ("mpswrap_server_clients", "gauge", "MPS clients of an MPS server"),
    ("mpswrap_server_active_thread_percentage", "gauge", "an MPS server's active thread %"),
    ("mpswrap_client_info", "gauge", "1 per MPS client; its command in the label"),
    ("mpswrap_client_gpu_memory_bytes", "gauge", "GPU memory an MPS client uses (NVML)"),
    ("mpswrap_client_active_thread_percentage", "gauge", "a client's thread % (its variable)"),
    ("mpswrap_client_uptime_seconds", "gauge", "seconds since an MPS client started"),
    ("mpswrap_gpu_memory_used_bytes", "gauge", "GPU memory used, all processes (NVML)"),
    ("mpswrap_gpu_utilization_percent", "gauge", "GPU utilisation over NVML's last sample"),
    ("mpswrap_faults", "gauge", "fatal GPU faults in the server log (its last 8 MiB)"),
    ("mpswrap_faults_unrecovered", "gauge", "faults whose server has not come back"),
)
FILE = "mpswrap.prom"


def _escape(value: Any) -> str:
    """A label value: UTF-8 (bytes of a command line that were no UTF-8 written as \\x..),
    with backslash, quote and newline escaped."""
    text = "" if value is None else str(value)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, Any]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(int(value))


def _samples(status: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], float]]:
    yield "mpswrap_jobs", {"node": status["node"]}, len(status["jobs"])
    for job in status["jobs"]:
        for gpu in job["gpus"]:
            daemon = gpu.get("daemon") or {}
            at = {
                "node": job["node"],
                "job": job["job"],
                "user": daemon.get("user"),
                "gpu_uuid": gpu.get("uuid"),
                "gpu": gpu["key"],
                "job_dir": job["job_dir"],
            }
            yield "mpswrap_daemon_up", at, 1 if daemon.get("alive") else 0
            yield from _gpu_samples(gpu, at)
            usage, its = gpu.get("usage") or {}, {"node": job["node"], "gpu_uuid": gpu.get("uuid")}
            for key in ("memory_used_bytes", "utilization_percent"):
                if usage.get(key) is not None:
                    yield f"mpswrap_gpu_{key}", its, usage[key]


def _gpu_samples(
    gpu: dict[str, Any], at: dict[str, Any]
) -> Iterator[tuple[str, dict[str, Any], float]]:
    faults = gpu.get("faults", [])
    yield "mpswrap_faults", at, len(faults)
    yield "mpswrap_faults_unrecovered", at, sum(not f["recovered"] for f in faults)
    for server in gpu.get("servers", []):
        here = {**at, "server_pid": server["pid"]}
        yield "mpswrap_server_clients", here, len(server["clients"])
        yield "mpswrap_server_active_thread_percentage", here, server["active_thread_percentage"]
        for client in server["clients"]:
            who = {**here, "pid": client["pid"], "rank": client.get("rank")}
            yield "mpswrap_client_info", {**who, "command": client.get("cmdline", "")[:200]}, 1
            for key, name in (
                ("gpu_memory_bytes", "gpu_memory_bytes"),
                ("active_thread_percentage", "active_thread_percentage"),
                ("uptime_s", "uptime_seconds"),
            ):
                if client.get(key) is not None:
                    yield f"mpswrap_client_{name}", who, client[key]


def render(status: dict[str, Any]) -> str:
    """The exposition of ``status`` (``mpswrap status --json``'s object)."""
    by_family: dict[str, list[str]] = {name: [] for name, _, _ in FAMILIES}
    seen: set[str] = set()
    for name, labels, value in _samples(status):
        series = f"{name}{_labels(labels)}"
        if series in seen:  # e.g. a GPU two jobs share: its figures once
            continue
        seen.add(series)
        by_family[name].append(f"{series} {_number(value)}")
    lines: list[str] = []
    for name, kind, text in FAMILIES:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *by_family[name]]
    return "\n".join(lines) + "\n"


def write_textfile(folder: Path, text: str) -> Path:
    """Replace ``folder/mpswrap.prom`` whole: written beside it, then renamed over it."""
    if not folder.is_dir():
        raise UsageError("--textfile needs an existing directory", thing=str(folder))
    target = folder / FILE
    fd, tmp = tempfile.mkstemp(prefix=".mpswrap.prom.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
