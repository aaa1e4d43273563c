"""``mpswrap start|stop|status``: manage a job's daemons by hand (user mode or as root)."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

from . import _proc
from .config import Settings, load_settings
from .daemon import Defaults, StopReport
from .errors import UsageError
from .gpu import load_inventory, resolve_gpus
from .jobenv import JobEnv, parse_int_list
from .node import JobDaemons, check_run_dir_writable, user_layout
from .paths import JobLayout

__all__ = ["cli", "find_layouts", "print_status", "report_lines"]

log = logging.getLogger(__name__)


def _job_and_node(args: argparse.Namespace) -> tuple[str, str]:
    env = JobEnv.current()
    job = args.job if args.job is not None else env.job_id or "local"
    return job, args.node if args.node is not None else env.node


def find_layouts(
    settings: Settings, node: str, job: str, run_dir: str | None = None
) -> list[JobLayout]:
    """Where this job's state may be: an explicit run dir, else admin and user layouts."""
    if run_dir:
        return [JobLayout(Path(os.path.abspath(run_dir)), node, job)]
    layouts = [JobLayout(Path(settings.run_dir), node, job)]
    mine = user_layout(settings, node, job)
    if mine.run_dir != layouts[0].run_dir:
        layouts.append(mine)
    return layouts


def _settings(args: argparse.Namespace, **overrides: Any) -> Settings:
    return load_settings(
        {k: v for k, v in overrides.items() if v is not None}, config_file=args.config
    )


def _allowed_cpus(text: str | None) -> frozenset[int] | None:
    if text:
        return frozenset(parse_int_list(text, "--cpus"))
    return frozenset(os.sched_getaffinity(0))


def cmd_start(args: argparse.Namespace) -> int:
    settings = _settings(
        args,
        active_thread_percentage=args.threads,
        pinned_mem_limit=args.mem_limit,
        client_priority=args.priority,
        prestart_server=True if args.prestart else None,
    )
    user = _proc.lookup_user(args.user) if args.user else _proc.lookup_user()
    if user.uid != os.geteuid() and os.geteuid() != 0:
        raise UsageError("--user needs root", thing=args.user)
    job, node = _job_and_node(args)
    inventory = load_inventory(settings.gpu_inventory)
    gpus = resolve_gpus(args.gpus, inventory)
    admin = os.geteuid() == 0 and not args.run_dir
    if args.run_dir:
        layout = JobLayout(Path(os.path.abspath(args.run_dir)), node, job)
    elif admin:
        layout = JobLayout(Path(settings.run_dir), node, job)
    else:
        layout = user_layout(settings, node, job)
    check_run_dir_writable(layout)
    started_by = "cli"
    manifests = JobDaemons(layout, settings).start(
        gpus,
        user,
        started_by=started_by,
        defaults=Defaults.from_settings(settings),
        shared_parents=admin,
        allowed_cpus=_allowed_cpus(args.cpus),
    )
    if args.json:
        print(json.dumps([json.loads(m.to_json()) for m in manifests], indent=1))
    else:
        for m, gpu in zip(manifests, gpus):
            pipe = layout.gpu(m.key).pipe
            print(
                f"{m.key} {gpu.uuid} daemon {m.daemon_pid} user {m.user} "
                f"cpus {_cpus(m.cpus)} pipe {pipe}"
            )
        print(
            f"export CUDA_MPS_PIPE_DIRECTORY={layout.gpu(manifests[0].key).pipe}"
            if len(manifests) == 1
            else f"# job directory: {layout.job_dir}"
        )
    return 0


def _cpus(cpus: list[int]) -> str:
    return ",".join(map(str, cpus)) if cpus else "all"


def report_lines(reports: list[StopReport]) -> list[str]:
    lines = []
    for r in reports:
        notes = f"; {'; '.join(r.notes)}" if r.notes else ""
        forced = f", forced daemon/server {r.forced}" if r.forced else ""
        lines.append(
            f"{r.key}: terminated {len(r.terminated)} client(s), killed "
            f"{len(r.killed)}{forced}; "
            f"server.log: {r.log_terminations} client termination(s) succeeded, "
            f"{r.log_faults} fatal error(s){notes}"
        )
        lines += [f"{r.key}: LEFT BEHIND: {item}" for item in r.leftovers]
    return lines


def cmd_stop(args: argparse.Namespace) -> int:
    settings = _settings(args)
    job, node = _job_and_node(args)
    reports: list[StopReport] = []
    for layout in find_layouts(settings, node, job, args.run_dir):
        if layout.job_dir.exists():
            reports += JobDaemons(layout, settings).stop()
    for line in report_lines(reports):
        print(line)
    if not reports:
        print(f"nothing to stop for job {job} on {node}")
    return 0 if all(r.clean for r in reports) else 1


def cmd_status(args: argparse.Namespace) -> int:
    settings = _settings(args)
    job, node = _job_and_node(args)
    found = [
        JobDaemons(layout, settings).status()
        for layout in find_layouts(settings, node, job, args.run_dir)
        if layout.job_dir.exists()
    ]
    status = found[0] if found else {"node": node, "job": job, "gpus": []}
    for extra in found[1:]:
        status["gpus"] += extra["gpus"]
    if args.json:
        print(json.dumps(status, indent=1))
    else:
        print_status(status)
    return 0


def print_status(status: dict[str, Any]) -> None:
    print(f"job {status['job']} on {status['node']}: {len(status['gpus'])} GPU daemon(s)")
    for gpu in status["gpus"]:
        daemon = gpu.get("daemon") or {}
        state = "running" if daemon.get("alive") else "NOT RUNNING"
        print(
            f"  {gpu['key']} {gpu.get('uuid')} daemon {daemon.get('pid')} {state} "
            f"(by {daemon.get('started_by')}, user {daemon.get('user')}, "
            f"cpus {_cpus(daemon.get('cpus') or [])})"
        )
        for server in gpu.get("servers", []):
            print(
                f"    server {server['pid']} {server['status']} "
                f"threads {server['active_thread_percentage']:g}% "
                f"clients {len(server['clients'])}"
            )
            for client in server["clients"]:
                print(f"      client {client['pid']} {client['cmdline']}")
        for fault in gpu.get("faults", []):
            print(
                f"    FAULT at {fault['time']}: server {fault['server_pid']}, reported by "
                f"client(s) {fault['reported_by']}, affected {fault['affected']}, "
                f"{'recovered' if fault['recovered'] else 'not recovered'}"
            )


def cli(args: argparse.Namespace) -> int:
    handler = {"start": cmd_start, "stop": cmd_stop, "status": cmd_status}[args.command]
    return handler(args)
