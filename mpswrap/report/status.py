"""The status model of a node's jobs, and its words: what ``mpswrap status`` prints, what
``mpswrap metrics`` exposes (``report.metrics``) and how ``status`` judges health; and the
words for a teardown's record (``mpswrap report``, ``mps.record``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._wait import Deadline
from ..config import Settings
from ..errors import shown
from ..job.job import JobDaemons
from ..mps.gpu import usage
from ..paths import JobLayout
from .summary import codes_words

__all__ = ["DEADLINE", "cpus_words", "node_status", "print_status", "record_line", "unhealthy"]


#: Seconds one ``status`` or ``metrics`` run gives the node's daemons in all (each command
#: still within ``command_timeout``): a daemon it leaves no time to ask, or whose answer is
#: late, is "not answered in time" (unhealthy: ``status`` exits 3). Whatever a job user's
#: socket or directories multiply, root's command ends.
DEADLINE = 10.0


def node_status(settings: Settings, node: str, layouts: Sequence[JobLayout]) -> dict[str, Any]:
    """The jobs' daemons, servers and clients on this node, with NVML's figures where it
    answers: each GPU's memory and utilisation, each client's GPU memory. The daemons root
    started are asked first, users' own after them, all within one ``DEADLINE``."""
    deadline = Deadline(DEADLINE)
    ordered = sorted(layouts, key=lambda lay: lay.owner is not None)  # stable: root's first
    jobs = [JobDaemons(layout, settings).status(deadline) for layout in ordered]
    asked: dict[str, dict[str, Any] | None] = {}  # once per GPU, however many jobs share it
    for gpu in (g for job in jobs for g in job["gpus"]):
        uuid = gpu.get("uuid")
        if uuid and uuid not in asked:
            asked[uuid] = usage(uuid, settings.gpu_inventory)
        found = dict(asked.get(uuid) or {}) if uuid else {}
        processes = found.pop("processes", {})
        gpu["usage"] = found or None
        for client in (c for s in gpu.get("servers", []) for c in s["clients"]):
            client["gpu_memory_bytes"] = processes.get(client["pid"])
    return {"node": node, "jobs": jobs}


#: A server's states that are healthy: serving, or starting (the real driver says INITIALIZING
#: for a moment after ``start_server``, 2026-11-28).
SERVING = ("ACTIVE", "INITIALIZING")


def unhealthy(job: dict[str, Any]) -> list[str]:
    """What in one job's status is not healthy, each naming the job and GPU."""
    where = f"job {job['job']} on {job['node']}"
    found = [] if job["gpus"] else [f"{where}: no GPU daemon in {job['job_dir']}"]
    for gpu in job["gpus"]:
        at = f"{where}, {gpu['key']}"
        daemon = gpu.get("daemon")
        if not daemon:
            found.append(f"{at}: no manifest (its daemon is starting, or failed to start)")
        elif not daemon.get("alive"):
            found.append(f"{at}: daemon {daemon.get('pid')} not running")
        elif gpu.get("error"):
            found.append(f"{at}: daemon does not answer: {_word(gpu['error'])}")
        found += [
            f"{at}: server {s['pid']} is {_word(s['status'])}"
            for s in gpu.get("servers", [])
            if s["status"] not in SERVING
        ]
        found += [
            f"{at}: fault at {_word(f['time'])} not recovered"
            for f in gpu.get("faults", [])
            if not f["recovered"]
        ]
    return found


def print_status(status: dict[str, Any]) -> None:
    print(f"job {status['job']} on {status['node']}: {len(status['gpus'])} GPU daemon(s)")
    runs = status.get("runs") or {}
    if runs.get("ended"):
        codes = {int(c): n for c, n in runs["exit_codes"].items()}
        print(f"  programs ended so far: {runs['ended']}, exit codes {codes_words(codes)}")
    for gpu in status["gpus"]:
        daemon = gpu.get("daemon") or {}
        if daemon.get("pid") is None:  # no manifest it could read: the error line says why
            print(f"  {gpu['key']} daemon unknown (no manifest read)")
        else:
            state = "running" if daemon.get("alive") else "NOT RUNNING"
            print(
                f"  {gpu['key']} {_word(gpu.get('uuid'))} daemon {daemon.get('pid')} {state} "
                f"(by {_word(daemon.get('started_by'))}, user {_word(daemon.get('user'))}, "
                f"cpus {cpus_words(daemon.get('cpus') or [])})"
            )
        if gpu.get("error"):
            print(f"    {_word(gpu['error'])}")
        for server in gpu.get("servers", []):
            print(
                f"    server {server['pid']} {_word(server['status'])} "
                f"threads {server['active_thread_percentage']:g}% "
                f"clients {len(server['clients'])}"
            )
            for client in server["clients"]:
                words = _client_words(client)
                print(f"      client {client['pid']}{words} {_word(client['cmdline'], 400)}")
        for fault in gpu.get("faults", []):
            print(
                f"    FAULT at {_word(fault['time'])}: server {fault['server_pid']}, reported by "
                f"client(s) {fault['reported_by']}, affected {fault['affected']}, "
                f"{'recovered' if fault['recovered'] else 'not recovered'}"
            )


def record_line(rec: dict[str, Any]) -> str:
    took = (rec["stopped"] - rec["daemon_started"]) if rec.get("daemon_started") else None
    faults = (
        "; ".join(
            f"fault at {_word(f['time'])}: server {f['server_pid']}, client(s) {f['reported_by']}"
            for f in rec["faults"]
        )
        or "no fault"
    )
    left = _word(", ".join(rec["leftovers"]), 400)
    return (
        f"job {rec['job']} on {rec['node']}, {rec['gpu']} {rec['gpu_uuid']} (user {rec['user']}"
        f"{f', {took:.0f} s' if took is not None else ''}): {rec['clients_seen_count']} "
        f"client(s) seen, {len(rec['ended_by_terminate_client'])} ended by terminate_client, "
        f"{len(rec['ended_with_server'])} with their server, {len(rec['killed'])} killed; "
        f"{faults}; {'left behind: ' + left if left else 'nothing left behind'}"
    )


def _client_words(client: dict[str, Any]) -> str:
    """`` rank R, task T, 1.2 GiB, 25% threads, up 3 s`` where each is known."""
    words = [f"{k} {client[k]}" for k in ("rank", "task") if client.get(k) is not None]
    if client.get("gpu_memory_bytes") is not None:
        words.append(f"{client['gpu_memory_bytes'] / 2**30:.2f} GiB")
    if client.get("active_thread_percentage") is not None:
        words.append(f"{client['active_thread_percentage']:g}% threads")
    if client.get("uptime_s") is not None:
        words.append(f"up {client['uptime_s']:.0f} s")
    shown = ", ".join(w for w in words if w)
    return f" ({shown})" if shown else ""


def _word(text: object, limit: int = 200) -> str:
    """What a job user or their processes may have written (a command line, a manifest's
    word, a control reply), as printed: no control character reaches the terminal."""
    return shown(str(text), limit)


def cpus_words(cpus: list[int]) -> str:
    return ",".join(map(str, cpus)) if cpus else "all"
