"""``mpswrap start|stop|status|metrics|report|config|container-args``: a job's daemons by hand
(user mode or as root), what they did, the settings, and what a container needs to reach them."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from .. import _proc, trust
from .._signals import raising
from ..config import Settings, admin_file, load_settings
from ..errors import ConfigError, MpswrapError, TrustError, UsageError
from ..job import containers, state
from ..job.job import JobDaemons
from ..jobenv import JobEnv, parse_int_list
from ..mps.gpu import load_inventory, resolve_gpus
from ..mps.manifest import Manifest
from ..mps.record import read_records
from ..mps.start import Defaults
from ..paths import JobLayout, validate_name
from ..report import metrics
from ..report.status import cpus_words, node_status, print_status, record_line, unhealthy

__all__ = [
    "cmd_config",
    "cmd_container_args",
    "cmd_metrics",
    "cmd_report",
    "cmd_start",
    "cmd_status",
    "cmd_stop",
]

log = logging.getLogger(__name__)


def _node(args: argparse.Namespace) -> str:
    return args.node if args.node is not None else JobEnv.current().node


def _layouts(args: argparse.Namespace, settings: Settings) -> list[JobLayout]:
    """The jobs a command acts on: ``--job`` (or the job this runs in) where its state is;
    else, or with ``--all``, every job of the caller's on this node (root: every job)."""
    env, node = JobEnv.current(), _node(args)
    job = None if getattr(args, "all", False) else env.job_key(given=args.job)
    if job is not None:
        return state.job_layouts(settings, node, job, os.getuid(), args.run_dir)
    if args.run_dir:
        raise UsageError(
            "--run-dir needs --job",
            hint=f"mpswrap {getattr(args, 'command', 'status')} --job ID --run-dir DIR",
        )
    return state.jobs_on_node(settings, node, None if os.geteuid() == 0 else os.getuid())


def _settings(args: argparse.Namespace, **overrides: Any) -> Settings:
    return load_settings(
        {k: v for k, v in overrides.items() if v is not None}, config_file=args.config
    )


def _allowed_cpus(text: str | None) -> frozenset[int] | None:
    """``--cpus`` within the CPUs this process may use (all of those without it)."""
    mine = frozenset(os.sched_getaffinity(0))
    if not text:
        return mine
    asked = frozenset(parse_int_list(text, "--cpus"))
    if not asked <= mine:
        raise UsageError(
            "bad --cpus",
            thing=text,
            cause=f"CPU(s) {cpus_words(sorted(asked - mine))} not available to this process",
            hint=f"choose among CPUs {cpus_words(sorted(mine))}",
        )
    return asked


def _start_settings(args: argparse.Namespace) -> Settings:
    """The settings with ``start``'s options over them (each checked as it was parsed)."""
    return _settings(
        args,
        prestart_server=True if args.prestart else None,
        active_thread_percentage=args.threads,
        pinned_mem_limit=args.mem_limit,
        client_priority=args.priority,
    )


def cmd_start(args: argparse.Namespace) -> int:
    settings = _start_settings(args)
    try:
        user = _proc.lookup_user(args.user) if args.user else _proc.lookup_user()
    except UsageError as exc:
        exc.with_context("--user")
        raise
    if user.uid != os.geteuid() and os.geteuid() != 0:
        raise UsageError("--user needs root", thing=args.user)
    node = _node(args)
    job = JobEnv.current().run_job(args.job, "start")
    gpus = resolve_gpus(args.gpus, load_inventory(settings.gpu_inventory))
    admin = os.geteuid() == 0 and not args.run_dir
    layout = state.layout_for(settings, node, job, admin=admin, run_dir=args.run_dir)
    began = time.time()
    manifests = JobDaemons(layout, settings).start(
        gpus,
        user,
        started_by="cli",
        defaults=Defaults.from_settings(settings),
        shared_parents=admin,
        allowed_cpus=_allowed_cpus(args.cpus),
    )
    _not_applied(args, [m for m in manifests if m.created < began])
    if args.json:
        print(json.dumps([json.loads(m.to_json()) for m in manifests], indent=1))
        return 0
    for m in manifests:
        print(
            f"{m.key} {m.gpu_uuid} daemon {m.daemon_pid} user {m.user} "
            f"cpus {cpus_words(m.cpus)} pipe {layout.gpu(m.key).pipe}"
        )
    print(
        f"export CUDA_MPS_PIPE_DIRECTORY={layout.gpu(manifests[0].key).pipe}"
        if len(manifests) == 1
        else f"# job directory: {layout.job_dir}"
    )
    return 0


def _not_applied(args: argparse.Namespace, running: list[Manifest]) -> None:
    """A daemon that was already running keeps what it started with: say which of the
    options given it did not take."""
    given = [
        option
        for option, value in (
            ("--threads", args.threads),
            ("--mem-limit", args.mem_limit),
            ("--priority", args.priority),
            ("--cpus", args.cpus),
            ("--prestart", args.prestart or None),
        )
        if value is not None
    ]
    for m in running if given else []:
        log.warning(
            "%s: daemon %d was already running: %s not applied (mpswrap stop, then start)",
            m.key,
            m.daemon_pid,
            ", ".join(given),
        )


def cmd_stop(args: argparse.Namespace) -> int:
    settings = _settings(args)
    clean = True
    layouts = _layouts(args, settings)
    jobs = []
    for layout in layouts:
        done = JobDaemons(layout, settings).stop()
        clean = clean and done.clean
        if args.json:
            jobs.append({"node": layout.node, "job": layout.job_id, **done.to_json()})
            continue
        print(f"job {layout.job_id} on {layout.node} ({layout.job_dir}):")
        for line in done.lines():
            print(line)
    if args.json:
        print(json.dumps({"node": _node(args), "jobs": jobs, "clean": clean}, indent=1))
    elif not layouts:
        print(f"nothing to stop on {_node(args)}")
    return 0 if clean else 1


#: ``status`` exit codes (mpswrap.errors.EXIT_CODES describes them).
HEALTHY, UNHEALTHY, NOTHING_FOUND = 0, 3, 4


def _node_status(args: argparse.Namespace) -> dict[str, Any]:
    settings = _settings(args)
    return node_status(settings, _node(args), _layouts(args, settings))


def cmd_metrics(args: argparse.Namespace) -> int:
    """The node's state in Prometheus's text format: printed, or kept for node_exporter."""
    text = metrics.render(_node_status(args), process_labels=args.process_labels)
    if args.textfile:
        metrics.write_textfile(Path(args.textfile), text)
    else:
        print(text, end="")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Print the jobs' daemons; exit 0 when all is healthy, 3 when not, 4 when none; with
    ``--watch S``, again every S seconds until a signal ends it: 128+N for INT, TERM and HUP
    alike, as for every command a signal ends."""
    if args.watch is None:
        return _status_once(args)
    if args.watch <= 0:
        raise UsageError("--watch needs seconds above 0", thing=str(args.watch))
    with raising():  # main: Interrupted is 128+N
        while True:
            print(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
            _status_once(args)
            sys.stdout.flush()
            time.sleep(args.watch)


def _status_once(args: argparse.Namespace) -> int:
    status = _node_status(args)
    jobs = status["jobs"]
    if args.json:
        print(json.dumps(status, indent=1))
    elif not jobs:
        print(f"no MPS daemons of mpswrap on {status['node']}")
    for job in [] if args.json else jobs:
        print_status(job)
    problems = [item for job in jobs for item in unhealthy(job)]
    for item in problems:
        log.warning("not healthy: %s", item)
    if problems:
        return UNHEALTHY
    return HEALTHY if jobs else NOTHING_FOUND


def cmd_report(args: argparse.Namespace) -> int:
    """The records a job's teardowns kept under log_archive (mps/record): 0, or 4 for none."""
    settings = _settings(args)
    if not settings.log_archive:
        raise UsageError(
            "no log_archive is set: teardowns keep no records",
            hint="set log_archive in the admin file (slurm/README.md)",
        )
    found = read_records(Path(settings.log_archive), validate_name("job id", args.job_id))
    if args.json:
        print(json.dumps(found, indent=1))
    for rec in [] if args.json else found:
        print(record_line(rec))
    if not found:
        log.warning("no record of job %s in %s", args.job_id, settings.log_archive)
    return HEALTHY if found else NOTHING_FOUND


def cmd_config(args: argparse.Namespace) -> int:
    """The resolved settings; on stderr, a warning for each file root's hooks refuse to read
    or run (a bad key or value still fails the command: install-hooks relies on that)."""
    problems: list[ConfigError] = []
    settings = load_settings(config_file=args.config, problems=problems)
    for problem in problems:
        if not isinstance(problem, TrustError):
            raise problem
    rows = settings.describe()
    if args.json:
        print(json.dumps({n: {"value": v, "source": s} for n, v, s in rows}, indent=1))
    else:
        width = max(len(n) for n, _, _ in rows)
        for name, value, source in rows:
            print(f"{name:<{width}}  {value:<40}  ({source})")
    for line in _untrusted(settings, args.config):
        print(f"mpswrap: warning: {line}", file=sys.stderr)
    return 0


def _untrusted(settings: Settings, config_file: str | None) -> list[str]:
    """The admin file and control program, where a user other than root may change them:
    root's hooks then neither read nor run them (``trust``), whoever asks."""
    from ..mps.control import locate_binary

    found = []
    path = admin_file(os.environ, config_file)
    level = trust.changeable_level(path) if os.path.exists(path) else None
    if level:
        found.append(
            f"root ignores the admin config file {path}: {level} can be changed by "
            "a user other than root"
        )
    try:
        binary: str | None = locate_binary(settings.control_binary)
    except MpswrapError:
        binary = None  # not installed here: nothing to judge
    level = trust.changeable_level(binary) if binary else None
    if level:
        found.append(
            f"root will not run the MPS control program {binary}: {level} can be "
            "changed by a user other than root"
        )
    return found


def cmd_container_args(args: argparse.Namespace) -> int:
    runtime = containers.runtime_named(args.runtime)
    settings = load_settings(config_file=args.config)
    directory = containers.bind_dir(settings, JobEnv.current(), args.job)
    out = containers.flags(runtime, directory, os.getuid())
    if any(re.search(r"\s", word) for word in out):  # $(...) splits words at blanks
        raise UsageError(
            "the job's directory has a blank in its path",
            thing=str(directory),
            hint="set user_run_dir to a path without blanks",
        )
    print(" ".join(out))
    return 0
