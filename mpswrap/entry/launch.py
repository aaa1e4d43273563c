"""The launcher front end: prefix mode (``mpswrap srun|mpirun ...``) and per-rank mode
(``srun mpswrap ./app``, ``mpirun -np 8 mpswrap ./app``).

- prefix: refuse what cannot fit before launching, then run the launcher with ``mpswrap --``
  inserted before each program (``launchargs``), handing signals to it, and return its exit
  code;
- per rank: attach to the job's daemons (the prolog's, or start/join user-mode ones), place
  this rank on its GPU, and supervise the program (``job.supervise``).
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from .. import _proc
from .._signals import TERMINATING, SignalTrap
from ..config import Settings, load_settings
from ..errors import GpuError, MpswrapError
from ..job import state
from ..job.job import Attachment, JobDaemons, attach, leave, log_teardown
from ..job.placement import Placement, Slot, check_capacity, place
from ..job.summary import Outcome, emit
from ..job.supervise import Rank, supervise, watch
from ..jobenv import JobEnv
from ..mps.gpu import (
    GpuInfo,
    Inventory,
    client_limit,
    inventory_from_json,
    load_inventory,
    resolve_gpus,
)
from ..mps.slurmgpus import visible_gpus
from . import launchargs

__all__ = [
    "LaunchOptions",
    "attached_inventory",
    "attached_slots",
    "capacity_limits",
    "finish",
    "per_rank",
    "prefix",
]

log = logging.getLogger(__name__)

#: Open MPI's odls_base_sigkill_timeout T (default 1 s): when mpirun aborts (a signal, a failed
#: rank) it SIGTERMs every rank's process group after T and SIGKILLs it, client included,
#: after 2T (seen with Open MPI 4.1). The ladder of a dozen ranks through one busy real daemon
#: needed more than 1 s on an H100; T also delays the SIGTERM, so it stays small.
OMPI_SIGKILL_TIMEOUT = "5"


@dataclass(frozen=True)
class LaunchOptions:
    """The wrapper options (``mpswrap --help``) shared by every launch mode."""

    gpus: str | None = None
    policy: str | None = None
    threads: str | None = None
    mem_limit: str | None = None
    priority: int | None = None
    verify_attach: str | None = None
    verify_timeout: float = 30.0
    no_shield: bool = False
    grace: float | None = None
    dry_run: bool = False
    job: str | None = None
    debug: bool = False

    def settings(self) -> Settings:
        return load_settings({"gpu_policy": self.policy})

    def verify_mode(self, settings: Settings) -> str:
        """``--verify-attach`` if given, else the ``verify_attach`` setting (warn|fail|off)."""
        return self.verify_attach or settings.verify_attach

    def grace_s(self, settings: Settings) -> float:
        return settings.kill_grace if self.grace is None else self.grace

    def place(
        self,
        slots: Sequence[Slot],
        rank: int,
        size: int,
        *,
        policy: str,
        rank_cpus: frozenset[int] | None = None,
    ) -> Placement:
        """A rank's GPU and client environment under these options."""
        return place(
            slots,
            rank,
            size,
            policy=policy,
            rank_cpus=rank_cpus,
            threads=self.threads,
            mem_limit=self.mem_limit,
            priority=self.priority,
        )

    def chosen_gpus(self, inventory: Inventory) -> list[GpuInfo] | None:
        return None if self.gpus is None else resolve_gpus(self.gpus, inventory)

    def nvml_choice(
        self, settings: Settings, nvml: bool = False
    ) -> tuple[Inventory | None, list[GpuInfo] | None]:
        """NVML's inventory where ``--gpus`` (NVML's indices) or the caller (``nvml``) needs
        it, and the GPUs ``--gpus`` names; else (None, None), and NVML is not loaded."""
        if self.gpus is None and not nvml:
            return None, None
        inventory = load_inventory(settings.gpu_inventory)
        return inventory, self.chosen_gpus(inventory)

    def rank_argv(self, job: str | None) -> list[str]:
        """``python -m mpswrap --opt=value ... --``: the same interpreter on every node. One
        token per option, so that a value such as ``--job stop`` never reads as a command."""
        skip = {"dry_run", "debug", "no_shield", "verify_timeout", "job"}
        values: dict[str, object] = {"job": job}
        values.update((f.name, getattr(self, f.name)) for f in fields(self) if f.name not in skip)
        # Unless given here, the ranks' own verify_attach setting applies (MPSWRAP_* reach them).
        timed = self.verify_attach or self.verify_timeout != LaunchOptions.verify_timeout
        values["verify_timeout"] = self.verify_timeout if timed else None
        out = [sys.executable, "-m", "mpswrap"]
        out += [f"--{k.replace('_', '-')}={v}" for k, v in values.items() if v is not None]
        out += ["--no-shield"] if self.no_shield else []
        out += ["--debug"] if self.debug else []
        return [*out, "--"]


def capacity_limits(uuids: list[str], inventory: Inventory, settings: Settings) -> dict[str, int]:
    """Each GPU's client limit (by architecture and driver, or as the admin set it)."""
    driver, limit = inventory.cuda_driver_version, settings.client_limit
    return {u: client_limit(inventory.by_uuid(u), driver, os.environ, limit) for u in uuids}


# --- per-rank mode -------------------------------------------------------------------------
def _local_position(env: JobEnv, policy: str) -> tuple[int, int, str]:
    """(local rank, local size, policy) by the innermost launcher's variables."""
    rank, size = env.local_rank, env.local_size
    if rank is None:
        return 0, max(size or 1, 1), policy
    if size is None or size <= rank:
        log.warning(
            "local rank %d but no usable local size (%s): placing ranks cyclically", rank, size
        )
        return rank, rank + 1, "cyclic"
    return rank, size, policy


def attached_slots(
    att: Attachment, inventory: Inventory, chosen: list[GpuInfo] | None
) -> list[Slot]:
    """The attachment's GPUs, restricted to ``--gpus`` for prolog daemons."""
    slots = att.daemons.slots(inventory)
    if chosen is None or att.mode == "user":
        return slots
    wanted = {g.uuid for g in chosen}
    picked = [s for s in slots if s.uuid in wanted]
    if not picked:
        raise GpuError("--gpus names none of the job's MPS GPUs", thing=", ".join(wanted))
    return picked


def attached_inventory(att: Attachment, settings: Settings) -> Inventory:
    """The attached GPUs as their daemons' starter saw them (the manifests; looked up by UUID
    only, which a job's cgroup does not change), so that a rank joining them loads no NVML;
    NVML for user-mode daemons (the capacity check needs the driver's version) and where a
    manifest has no GPU facts (an older mpswrap wrote it)."""
    if att.mode != "prolog":
        return load_inventory(settings.gpu_inventory)
    try:
        found = inventory_from_json({"gpus": [m.gpu for m in att.manifests]}, "manifests")
    except GpuError:
        return load_inventory(settings.gpu_inventory)
    if [g.uuid for g in found.gpus] != [m.gpu_uuid for m in att.manifests]:
        return load_inventory(settings.gpu_inventory)
    return found


def _dry_run(
    opts: LaunchOptions,
    command: list[str],
    slots: list[Slot],
    env: JobEnv,
    position: tuple[int, int, str],
) -> int:
    """Say where this rank would run: the GPU, its variables, the command."""
    rank, size, policy = position
    found = opts.place(slots, rank, size, policy=policy, rank_cpus=env.cpus_allowed)
    print(
        f"[{rank}] gpu {found.position} ({found.uuid}): {_shown(found.env)} {shlex.join(command)}"
    )
    return 0


def per_rank(opts: LaunchOptions, command: list[str]) -> int:
    """One rank: attach, place, supervise; the node's last rank to leave prints its summary
    (``job.summary``: ranks of one node that do not overlap in time print one each)."""
    start = time.time()
    settings = opts.settings()
    env = JobEnv.current()
    job = env.job_key(given=opts.job, fresh="local")
    assert job is not None
    rank, size, policy = _local_position(env, settings.gpu_policy)
    # NVML only where NVML's view is asked for: --gpus (its indices), a dry run, user mode.
    inventory, chosen = opts.nvml_choice(settings, nvml=opts.dry_run)
    if opts.dry_run and inventory is not None:
        slots = planned_slots(settings, env, job, inventory, chosen)
        return _dry_run(opts, command, slots, env, (rank, size, policy))
    # Signals are recorded, not acted on, until the child runs: attach/release must finish.
    with SignalTrap() as trap:
        att = attach(settings, env, job, gpus=chosen, counted=True)
        outcomes: list[Outcome] = []  # none if the program never started: its error says why
        try:
            inventory = inventory or attached_inventory(att, settings)
            slots = attached_slots(att, inventory, chosen)
            if att.mode == "user":
                uuids = [s.uuid for s in slots]
                check_capacity(uuids, size, policy, capacity_limits(uuids, inventory, settings))
            found = opts.place(slots, rank, size, policy=policy, rank_cpus=env.cpus_allowed)
            early = [s for s in trap.pop() if s in TERMINATING]
            if early:
                return 128 + early[0]
            outcomes.append(
                supervise(
                    command,
                    {**os.environ, **found.env},
                    daemon=att.daemons.daemon(found.slot.key),
                    grace=opts.grace_s(settings),
                    shield=not opts.no_shield,
                    verify_attach=opts.verify_mode(settings),
                    verify_timeout=opts.verify_timeout,
                    start=start,
                    name=f"rank {rank if env.rank is None else env.rank}",
                )
            )
        finally:
            left = finish(att, outcomes, "rank")
    return outcomes[0].code or int(left > 0)


def finish(att: Attachment, outcomes: Sequence[Outcome], context: str) -> int:
    """Leave the job's daemons: log what their teardown left behind and, from the node's
    last owner, print the node's summary (none where no program ran); how many processes
    of the job survived the teardown (a run that would exit 0 then exits 1). On the
    prolog's daemons there is no teardown to lose: the summary never fails such a rank."""
    try:
        done = leave(att, outcomes)
    except (MpswrapError, OSError) as exc:
        if att.mode == "user":
            raise
        log.warning("summary: this rank's outcome not recorded (%s)", exc)
        return 0
    log_teardown(done.teardown, context)
    node = done.summary()
    if node is not None and node.outcomes:
        emit(node)
    return len(done.teardown.survivors()) if done.teardown else 0


def _shown(env: Mapping[str, str]) -> str:
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))


def planned_slots(
    settings: Settings, env: JobEnv, job: str, inventory: Inventory, chosen: list[GpuInfo] | None
) -> list[Slot]:
    """What ``attach`` would use, without starting anything (``--dry-run``)."""
    admin = JobDaemons(state.admin_layout(settings, env.node, job), settings)
    if admin.live_manifests():
        return admin.slots(inventory)
    gpus = chosen if chosen is not None else visible_gpus(env, inventory)
    layout = state.user_layout(settings, env.node, job)
    return [Slot.of(layout.gpu(f"g{i}"), g.uuid, inventory) for i, g in enumerate(gpus)]


# --- prefix mode ---------------------------------------------------------------------------
def prefix(opts: LaunchOptions, argv: list[str]) -> int:
    line = launchargs.parse(argv)
    settings = opts.settings()
    env = dict(os.environ)
    exported = [v for s in line.segments for v in s.values("export")]
    if any(not v.startswith("ALL") for v in exported):  # srun passes only what it names
        log.warning(
            "srun --export=%s: MPSWRAP_* settings reach the ranks only if named there", exported[-1]
        )
    fresh = f"mpirun-{os.getpid()}" if line.family == launchargs.OMPI else None
    # srun outside an allocation: its ranks get the new job's SLURM_JOB_ID.
    job = JobEnv(env).job_key(given=opts.job, fresh=fresh)
    _check_launch_capacity(line, opts, settings, env, job)
    extra = _launch_env(line, env, job)
    env.update(extra)
    exports: list[str] = []
    if line.family == launchargs.OMPI:  # Open MPI gives remote ranks only what -x names
        for name in sorted(n for n in env if n.startswith("MPSWRAP_")):
            exports += ["-x", name]
    rewritten = line.argv(opts.rank_argv(job), exports)
    if opts.dry_run:
        for name, value in sorted(extra.items()):
            print(f"{name}={shlex.quote(value)}")
        print(shlex.join(rewritten))
        return 0
    if job:
        log.info("job %s: launching %s", job, rewritten[0])
    settle = float(opts.grace_s(settings) + settings.terminate_timeout + 5)
    return _run_launcher(rewritten, env, settle)


def _launch_env(
    line: launchargs.CommandLine, env: Mapping[str, str], job: str | None
) -> dict[str, str]:
    """Variables for the launcher and every rank (the job id also goes on the ranks' command
    line: argv survives ``srun --export=NONE``)."""
    extra: dict[str, str] = {"MPSWRAP_JOB": job} if job else {}
    mca = "odls_base_sigkill_timeout"
    given = any(v == mca for s in line.segments for v in s.values("mca"))
    if line.family == launchargs.OMPI and not given and f"OMPI_MCA_{mca}" not in env:
        extra[f"OMPI_MCA_{mca}"] = OMPI_SIGKILL_TIMEOUT
    return extra


def _check_launch_capacity(
    line: launchargs.CommandLine,
    opts: LaunchOptions,
    settings: Settings,
    env: Mapping[str, str],
    job: str | None,
) -> None:
    """Refuse before launch when a GPU would get too many clients: the command line's ranks
    per node, plus the clients the job already runs on this node."""
    per_node = launchargs.ranks_per_node(line, env)
    if per_node is None:
        return
    job_env = JobEnv(env)
    try:
        inventory = load_inventory(settings.gpu_inventory)
        gpus = opts.chosen_gpus(inventory) or visible_gpus(job_env, inventory)
    except MpswrapError as exc:  # e.g. no NVML where the launch command runs
        log.debug("capacity not checked before launch: %s", exc.line())
        return
    uuids = [g.uuid for g in gpus[: launchargs.gpus_per_node(line) or len(gpus)]]
    running: dict[str, int] = {}
    for layout in state.job_layouts(settings, job_env.node, job, os.getuid()) if job else []:
        running.update(JobDaemons(layout, settings).clients())
    limits = capacity_limits(uuids, inventory, settings)
    check_capacity(uuids, per_node, settings.gpu_policy, limits, running)


def _run_launcher(argv: list[str], env: Mapping[str, str], settle: float) -> int:
    """Run the launcher in our process group and return its exit code (128+signal after
    TERM/INT/HUP).

    The terminal, ``kill -- -PGID`` and Slurm (every process of the step) signal the launcher
    directly. Forwarding those at once would deliver them twice, and twice means "abort now"
    to both launchers: mpirun then SIGKILLs every rank (mid terminate_client), srun kills the
    tasks on a second ^C. So TERM/INT/HUP are forwarded only if the launcher still runs
    ``settle`` seconds later (it may not have got it: ``kill <mpswrap pid>``), and killed
    with its processes if it still runs ``settle + 30`` s after that. USR1/USR2 go at once.
    """
    with SignalTrap() as trap:
        proc = _proc.spawn(argv, env=env, new_session=False, stdin=None, cwd=None)
        ident = _proc.identify(proc.pid) or _proc.ProcId(proc.pid, 0.0)
        launcher = Rank(proc, ident, None, argv[0])
        steps: list[tuple[float, int]] = []  # (when, signal) still to send to the launcher

        def schedule(sig: int) -> None:
            now = time.monotonic()
            steps[:] = [(now + settle, sig), (now + 2 * settle + 30, signal.SIGKILL)]

        def send_due() -> float:
            if steps and time.monotonic() >= steps[0][0]:
                sig = steps.pop(0)[1]
                log.warning(
                    "%s still running %g s after a signal: sending it signal %d",
                    argv[0],
                    settle,
                    sig,
                )
                tree = _proc.children_of(ident.pid) if sig == signal.SIGKILL else []
                _proc.kill_procs([ident, *tree], sig)
            return max(0.0, steps[0][0] - time.monotonic()) if steps else 1.0

        return watch([launcher], trap, grace=settle, on_terminate=schedule, tick=send_due)
