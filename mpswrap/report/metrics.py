"""``mpswrap metrics``: the node's MPS daemons, servers and clients in the Prometheus text
exposition format (version 0.0.4), printed, or written for node_exporter's textfile collector
(``--textfile DIR``: ``DIR/mpswrap.prom``, replaced whole, so a scrape never reads half of it).

Written by hand, not with prometheus_client: the format is small and fixed, and the hooks and
the CLI stay without a further dependency; the tests parse the output with prometheus_client
and check it with ``promtool check metrics``.

Labels name what lasts: the node, the job, the GPU, and the task (a rank, or a farm task).
A job's series carry ``node``, ``job_id`` (not ``job``: Prometheus gives every scraped series
a ``job`` label of its own and would rename ours), ``job_dir`` (two directories of one job id,
a prolog's and a user's, stay two series), and per GPU ``user``, ``gpu`` (the job's GPU key)
and ``gpu_uuid``. Client figures are summed per ``rank`` and ``task`` (empty where a client's
environment names none or may not be read), never per process: a pid or a command line in a
label makes a new series for every process, so they come only when asked for
(``process_labels``: a ``pid`` label on the client series, and ``mpswrap_client_info`` with
the ``command``). A GPU's own figures are given once per GPU (``node``, ``gpu_uuid``), however
many jobs share it. Units are Prometheus's base units: bytes, seconds, ratios (0-1).
``mpswrap_build_info`` (1, labelled by mpswrap's version and the Python that wrote the file)
says which mpswrap each node runs, as ``prometheus_build_info`` and ``python_info`` do; an
installed wheel knows no commit, so there is no ``revision`` label. docs/reference.md lists
the series.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import __version__
from .._struct import Struct
from ..errors import UsageError, controls_escaped

__all__ = ["FAMILIES", "Family", "build_labels", "render", "write_textfile"]

NODE = ("node",)
#: What wrote the file: ``mpswrap_build_info``'s labels.
BUILD = ("version", "python")
JOB = ("node", "job_id", "job_dir")
GPU = (*JOB, "user", "gpu", "gpu_uuid")
TASK = (*GPU, "rank", "task")
#: A GPU's own figures: the same for every job that uses it.
ONE_GPU = ("node", "gpu_uuid")
#: What ``process_labels`` adds to the client series (``pid``) and to the info series.
PROCESS = ("pid", "command")
#: A command line in a label is cut here.
COMMAND_LIMIT = 200


class Family(Struct, frozen=True):
    """One metric family: its name, type, labels and help text."""

    name: str
    kind: str  # "gauge" or "counter"
    labels: tuple[str, ...]
    help: str

    @property
    def per_process(self) -> bool:
        """A client family: one series per process (``pid``) with ``process_labels``."""
        return self.labels[-2:] == TASK[-2:]


#: The families ``render`` writes, in this order.
FAMILIES = (
    Family(
        "mpswrap_build_info",
        "gauge",
        BUILD,
        "1, labelled by the version of mpswrap and of the Python that wrote these metrics",
    ),
    Family("mpswrap_jobs", "gauge", NODE, "MPS jobs of mpswrap on this node"),
    Family(
        "mpswrap_daemon_up", "gauge", GPU, "1 while the job's MPS control daemon of the GPU runs"
    ),
    Family("mpswrap_servers", "gauge", (*GPU, "state"), "MPS servers of the daemon, by state"),
    Family(
        "mpswrap_server_active_thread_ratio",
        "gauge",
        GPU,
        "default active thread share of the daemon's MPS server (0-1)",
    ),
    Family("mpswrap_clients", "gauge", TASK, "MPS clients of a rank or farm task"),
    Family(
        "mpswrap_client_gpu_memory_bytes",
        "gauge",
        TASK,
        "GPU memory the MPS clients of a rank or task use (NVML)",
    ),
    Family(
        "mpswrap_client_active_thread_ratio",
        "gauge",
        TASK,
        "active thread share a rank or task set (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE/100)",
    ),
    Family(
        "mpswrap_client_start_time_seconds",
        "gauge",
        TASK,
        "when the first MPS client of a rank or task started, seconds since the epoch",
    ),
    Family(
        "mpswrap_client_info",
        "gauge",
        (*TASK, *PROCESS),
        "1 per MPS client, its pid and command (only with --process-labels)",
    ),
    Family(
        "mpswrap_programs_ended_total",
        "counter",
        (*JOB, "exit_code"),
        "programs of the job's runs that ended so far, by exit code (the run record)",
    ),
    Family(
        "mpswrap_gpu_memory_used_bytes", "gauge", ONE_GPU, "GPU memory used, all processes (NVML)"
    ),
    Family(
        "mpswrap_gpu_utilization_ratio",
        "gauge",
        ONE_GPU,
        "GPU utilisation over NVML's last sample (0-1)",
    ),
    Family("mpswrap_faults", "gauge", GPU, "fatal GPU faults in the server log (its last 8 MiB)"),
    Family("mpswrap_faults_unrecovered", "gauge", GPU, "faults whose server has not come back"),
)
FILE = "mpswrap.prom"
_BY_NAME = {f.name: f for f in FAMILIES}

Sample = tuple[str, dict[str, Any], float]


def _escape(value: Any) -> str:
    """A label value: UTF-8 (bytes of a command line that were no UTF-8 written as \\x..),
    with backslash, quote and newline escaped, other control characters (carriage return and
    tab too) as \\xNN
    (``errors.controls_escaped``): a job user's text sends no terminal an escape sequence."""
    text = "" if value is None else str(value)
    text = controls_escaped(text.encode("utf-8", "backslashreplace").decode("utf-8"))
    text = text.replace("\r", "\\x0d").replace("\t", "\\x09")  # a line break to a terminal
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(names: tuple[str, ...], values: dict[str, Any]) -> str:
    return "{" + ",".join(f'{k}="{_escape(values[k])}"' for k in names) + "}"


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def build_labels() -> dict[str, str]:
    """``mpswrap_build_info``'s labels: this mpswrap's version and this Python's."""
    return {"version": __version__, "python": ".".join(map(str, sys.version_info[:3]))}


def _samples(status: dict[str, Any], process_labels: bool) -> Iterator[Sample]:
    yield "mpswrap_build_info", build_labels(), 1
    yield "mpswrap_jobs", {"node": status["node"]}, len(status["jobs"])
    for job in status["jobs"]:
        at_job = {"node": job["node"], "job_id": job["job"], "job_dir": job["job_dir"]}
        for code, count in _code_counts(job).items():
            yield "mpswrap_programs_ended_total", {**at_job, "exit_code": code}, count
        for gpu in job["gpus"]:
            daemon = gpu.get("daemon") or {}
            at = {
                **at_job,
                "user": daemon.get("user"),
                "gpu": gpu["key"],
                "gpu_uuid": gpu.get("uuid"),
            }
            yield "mpswrap_daemon_up", at, 1 if daemon.get("alive") else 0
            yield from _server_samples(gpu, at)
            yield from _client_samples(gpu, at, process_labels)
            usage, its = gpu.get("usage") or {}, {"node": job["node"], "gpu_uuid": gpu.get("uuid")}
            if usage.get("memory_used_bytes") is not None:
                yield "mpswrap_gpu_memory_used_bytes", its, usage["memory_used_bytes"]
            if usage.get("utilization_percent") is not None:
                yield "mpswrap_gpu_utilization_ratio", its, usage["utilization_percent"] / 100


def _server_samples(gpu: dict[str, Any], at: dict[str, Any]) -> Iterator[Sample]:
    faults = gpu.get("faults", [])
    yield "mpswrap_faults", at, len(faults)
    yield "mpswrap_faults_unrecovered", at, sum(not f["recovered"] for f in faults)
    servers = gpu.get("servers", [])
    for state, count in sorted(Counter(s["status"] for s in servers).items()):
        yield "mpswrap_servers", {**at, "state": state}, count
    # A daemon runs as its job's user and so has one server; an active one where there are two.
    for server in sorted(servers, key=lambda s: s["status"] != "ACTIVE")[:1]:
        share = server["active_thread_percentage"]
        yield "mpswrap_server_active_thread_ratio", at, share / 100


def _client_samples(
    gpu: dict[str, Any], at: dict[str, Any], process_labels: bool
) -> Iterator[Sample]:
    """The clients' figures summed per rank and task (per process with ``process_labels``)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for client in (c for s in gpu.get("servers", []) for c in s["clients"]):
        key = (client.get("rank"), client.get("task"), client["pid"] if process_labels else None)
        groups.setdefault(key, []).append(client)
    for (rank, task, pid), clients in groups.items():
        who = {**at, "rank": rank, "task": task, **({"pid": pid} if process_labels else {})}
        yield "mpswrap_clients", who, len(clients)
        if process_labels:
            command = clients[0].get("cmdline", "")[:COMMAND_LIMIT]
            yield "mpswrap_client_info", {**who, "command": command}, 1
        for name, field, pick in (
            ("mpswrap_client_gpu_memory_bytes", "gpu_memory_bytes", sum),
            ("mpswrap_client_active_thread_ratio", "active_thread_percentage", max),
            ("mpswrap_client_start_time_seconds", "start_time", min),
        ):
            known = [c[field] for c in clients if c.get(field) is not None]
            if known:
                value = pick(known)
                yield name, who, value / 100 if field == "active_thread_percentage" else value


def render(status: dict[str, Any], process_labels: bool = False) -> str:
    """The exposition of ``status`` (``mpswrap status --json``'s object); ``process_labels``
    adds each client's pid (and command, in ``mpswrap_client_info``)."""
    by_family: dict[str, list[str]] = {f.name: [] for f in FAMILIES}
    seen: set[str] = set()
    for name, values, value in _samples(status, process_labels):
        family = _BY_NAME[name]
        names = (*family.labels, "pid") if process_labels and family.per_process else family.labels
        series = f"{name}{_labels(names, values)}"
        if series in seen:  # a GPU two jobs share: its figures once
            continue
        seen.add(series)
        by_family[name].append(f"{series} {_number(value)}")
    lines: list[str] = []
    for f in FAMILIES:
        lines += [f"# HELP {f.name} {f.help}", f"# TYPE {f.name} {f.kind}", *by_family[f.name]]
    return "\n".join(lines) + "\n"


def write_textfile(folder: Path, text: str) -> Path:
    """Replace ``folder/mpswrap.prom`` whole: written beside it, then renamed over it."""
    if not folder.is_dir():
        raise UsageError("--textfile needs an existing directory", thing=str(folder))
    target = folder / FILE
    try:
        _replace(target, text)
    except OSError as exc:
        raise UsageError(
            "cannot write the metrics file",
            thing=str(target),
            cause=exc.strerror or str(exc),
            hint="give a directory you can write (node_exporter's --collector.textfile.directory)",
            context="--textfile",
        ) from exc
    return target


def _replace(target: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".mpswrap.prom.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _code_counts(job: dict[str, Any]) -> dict[str, int]:
    """Programs ended, by exit code: 0-255 each its own label value, any other "other" (the
    run record is the job user's file: it must not mint a series per number it holds)."""
    counts: dict[str, int] = {}
    for code, count in ((job.get("runs") or {}).get("exit_codes") or {}).items():
        word = str(code) if str(code).isdigit() and int(str(code)) <= 255 else "other"
        counts[word] = counts.get(word, 0) + int(count)
    return counts
