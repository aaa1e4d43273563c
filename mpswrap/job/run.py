"""THE run lifecycle: every way to run programs under mpswrap on a node goes through here.

settings -> job identity -> the GPUs, chosen once -> capacity, checked once -> attach ->
run -> finish -> summary. ``mpswrap run``, the launcher's per-rank mode (``srun mpswrap
./app``), the farm, ``calibrate`` and ``session()`` differ only in what they run:

- ``plan`` decides everything a run could refuse, with nothing started: the job and where
  its daemons are (the prolog's, or this user's, whose directories are checked as a start
  would check them), the GPUs it uses (daemons start only for those), whether its clients
  fit. A dry run is ``plan`` and a print, so it refuses exactly what the run refuses.
- A plan is frozen: narrowing it to the clients a run starts (``Plan.use``) and attaching
  (``Plan.attach``, where the prolog's daemons came up since) each give a new plan.
- ``Run`` is the one context manager every way to run enters: it attaches (signals are only
  recorded until its block runs: attach and release always complete), its block runs the
  programs and sets a ``Result``, and it leaves: the node's last owner prints the summary
  line made from the run record (``job.outcomes``; ``report.summary``) and a run a signal
  ended says so in one line.
- ``dry_run_line`` is the one line a dry run prints for a rank.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from .._signals import TERMINATING, SignalTrap
from .._struct import Struct, field, fields, replace
from ..config import Settings, load_settings
from ..errors import GpuError, MpswrapError, UsageError
from ..jobenv import JobEnv
from ..mps.daemon import Daemon
from ..mps.gpu import (
    GpuInfo,
    Inventory,
    client_limit,
    inventory_from_json,
    load_inventory,
    resolve_gpus,
)
from ..mps.manifest import Manifest
from ..slurm.gpus import visible_gpus
from . import containers, state
from . import outcomes as records
from .job import Attachment, JobDaemons, Released, attach, leave, log_teardown, prolog_daemons
from .outcomes import Outcome
from .placement import (
    Placement,
    Slot,
    check_capacity,
    check_mem_limit,
    check_total,
    gpus_used,
    place,
    provision_threads,
    step_slots,
)
from .supervise import check_program

__all__ = ["LaunchOptions", "Plan", "Result", "Run", "grouped", "local_position", "plan"]

log = logging.getLogger(__name__)

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:
    from typing import Any


class LaunchOptions(Struct, frozen=True):
    """The wrapper options (``mpswrap --help``) shared by every way to run."""

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
    #: GPUs each rank uses (a JAX process, model parallelism): one daemon serves each group.
    gpus_per_rank: int | None = None

    @classmethod
    def of(cls, args: Any) -> LaunchOptions:
        """The launch options parsed command-line arguments hold (those a command does not
        take keep their defaults), checked as far as they can be without a GPU."""
        threads = getattr(args, "threads", None)
        if threads is not None:
            provision_threads(threads, 1, 0)  # raises UsageError naming the valid forms
        return cls(**{n: getattr(args, n) for n in fields(cls) if hasattr(args, n)})

    def settings(self) -> Settings:
        return load_settings({"gpu_policy": self.policy})

    def verify_mode(self, settings: Settings) -> str:
        """``--verify-attach`` if given, else the ``verify_attach`` setting (warn|fail|off)."""
        return self.verify_attach or settings.verify_attach

    def grace_s(self, settings: Settings) -> float:
        return settings.kill_grace if self.grace is None else self.grace

    def rank_argv(self, job: str | None) -> list[str]:
        """``python -m mpswrap --opt=value ... --``: the same interpreter on every node. One
        token per option, so that a value such as ``--job stop`` never reads as a command."""
        skip = {"dry_run", "debug", "no_shield", "verify_timeout", "job"}
        values: dict[str, object] = {"job": job}
        values.update((name, getattr(self, name)) for name in fields(self) if name not in skip)
        # Unless given here, the ranks' own verify_attach setting applies (MPSWRAP_* reach them).
        timed = self.verify_attach or self.verify_timeout != LaunchOptions.verify_timeout
        values["verify_timeout"] = self.verify_timeout if timed else None
        out = [sys.executable, "-m", "mpswrap"]
        out += [f"--{k.replace('_', '-')}={v}" for k, v in values.items() if v is not None]
        out += ["--no-shield"] if self.no_shield else []
        out += ["--debug"] if self.debug else []
        return [*out, "--"]


class Plan(Struct, frozen=True):
    """What a run will use, decided before anything starts (``plan``); narrowing it or
    attaching gives a new plan."""

    opts: LaunchOptions
    settings: Settings
    env: JobEnv
    kind: str  # run, rank, farm, calibrate, session: the fallback job name, the log words
    job: str
    daemons: JobDaemons  # where the job's daemons are, or will be
    mode: str  # "prolog" (the hooks' daemons, never stopped by a run) or "user"
    inventory: Inventory | None
    slots: tuple[Slot, ...]  # the GPUs the run uses, in placement order
    running: Mapping[str, int] = field(default_factory=dict)  # clients there now, per UUID
    gpus: tuple[GpuInfo, ...] = ()  # user mode: the daemons to start
    rank: bool = False  # one of the node's ranks: they count each other, not what runs
    start: float = field(default_factory=time.time)  # when the run began (epoch seconds)

    @property
    def policy(self) -> str:
        return self.settings.gpu_policy

    @property
    def uuids(self) -> list[str]:
        return [s.uuid for s in self.slots]

    def limits(self) -> dict[str, int]:
        """Each GPU's client limit (by architecture and driver, or as the admin set it). The
        manifests do not know the driver's version (60 clients from CUDA 13.1, else 48):
        NVML says it."""
        inventory = self.inventory
        if inventory is None or not inventory.cuda_driver_version:
            inventory = load_inventory(self.settings.gpu_inventory)
        driver, limit = inventory.cuda_driver_version, self.settings.client_limit
        return {
            u: client_limit(inventory.by_uuid(u), driver, os.environ, limit) for u in self.uuids
        }

    def free(self) -> int:
        """Clients each of the GPUs still takes (the fewest of them)."""
        limits = self.limits()
        return min(limits[u] - self.running.get(u, 0) for u in self.uuids)

    def use(self, clients: int, policy: str | None = None, *, gpus: int | None = None) -> Plan:
        """The plan narrowed to its first ``gpus`` GPUs (all: None), then to those that
        ``clients`` clients placed by ``policy`` use; refused when they would not fit beside
        the clients running there. On the prolog's daemons the placement keeps every GPU:
        they run."""
        policy = policy or self.policy
        planned = self
        if gpus is not None:
            planned = replace(self, slots=self.slots[:gpus], gpus=self.gpus[:gpus])
        known = planned.inventory is not None and planned.inventory.cuda_driver_version
        if planned.mode != "user" and planned.rank and not known:
            # A rank loads no NVML for the limit the prolog's manifests do not know: its
            # launch checked (``mpswrap srun|mpirun``), at no start-up cost to every rank.
            return planned
        limits = planned.limits()
        check_total(planned.uuids, clients, limits, planned.running)  # before work grows with it
        check_mem_limit(planned.slots, planned.opts.mem_limit)
        if planned.mode == "user":
            used = gpus_used(clients, len(planned.slots), policy)
            planned = replace(
                planned,
                slots=tuple(planned.slots[i] for i in used),
                gpus=tuple(planned.gpus[i] for i in used),
            )
        check_capacity(planned.uuids, clients, policy, limits, planned.running)
        return planned

    def place(
        self,
        rank: int,
        size: int,
        *,
        policy: str | None = None,
        threads: str | None = None,
        slots: Sequence[Slot] | None = None,
    ) -> Placement:
        """A client's GPU and environment under the run's options."""
        opts = self.opts
        return place(
            self.slots if slots is None else slots,
            rank,
            size,
            policy=policy or self.policy,
            rank_cpus=self.env.cpus_allowed,
            threads=opts.threads if threads is None else threads,
            mem_limit=opts.mem_limit,
            priority=opts.priority,
        )

    def check_program(self, command: Sequence[str]) -> None:
        """Refuse, before any daemon starts, a program that cannot run (127, 126), and a
        container runtime's command line whose client would miss its daemon (2)."""
        check_program(command, os.environ)
        self.check_container(command)

    def check_container(self, command: Sequence[str]) -> None:
        """Refuse (2) a container runtime's command line (a farm's task line too) whose
        client would not reach the run's daemons (``containers.check``)."""
        containers.check(command, [s.dirs.pipe for s in self.slots], os.environ)

    def attach(self, *, counted: bool = False) -> tuple[Attachment, Plan]:
        """The daemons the plan found, or the user-mode ones it chose, started or joined;
        and the plan on them (the prolog's, where they came up since it was made)."""
        keys = [s.key for s in self.slots] if self.mode == "user" else None
        att = attach(self.settings, self.env, self.job, gpus=self.gpus, keys=keys, counted=counted)
        if self.mode != "user":
            return att, self
        if att.mode == "user":  # the keys the owner lock gave, the plan's unless a rank came
            slots = tuple(  # first on other GPUs
                Slot.of(att.daemons.layout.gpu(m.key), m.gpu_uuid, self.inventory)
                for m in att.manifests
            )
            return att, self if slots == self.slots else replace(self, slots=slots)
        inventory = self.inventory or _manifest_inventory(att.manifests, self.settings)
        slots = tuple(att.daemons.slots(inventory, att.manifests))
        return att, replace(
            self, mode="prolog", daemons=att.daemons, inventory=inventory, slots=slots
        )

    def dry_run_line(
        self,
        rank: int,
        size: int,
        command: Sequence[str],
        env: Mapping[str, str] | None = None,
        **how: Any,
    ) -> str:
        """What a dry run prints for rank ``rank`` of ``size`` (``how``: ``place``'s
        arguments): its GPU, its environment and its command."""
        found = self.place(rank, size, **how)
        both = {**(env or {}), **found.env}
        shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(both.items()))
        number = found.slot.number(found.position)
        return f"[{rank}] gpu {number} ({found.uuid}): {shown} {shlex.join(command)}"


def plan(
    opts: LaunchOptions,
    kind: str,
    *,
    rank: bool = False,
    step: bool = False,
    settings: Settings | None = None,
) -> Plan:
    """The job, its daemons and the GPUs a run of ``kind`` may use, nothing started: the
    prolog's daemons where they run (restricted to ``--gpus``; ``step``: else to the step's
    GPUs, whose CUDA starts in this very process), else this user's on ``--gpus`` or the
    step's GPUs, their directories checked as a start checks them. ``rank``: one of the
    node's ranks (a launcher's, ``session()``'s), which counts the node's ranks, not the
    clients running there.
    ``settings``: the caller's (``session()``'s own), else the options'."""
    settings = settings or opts.settings()
    env = JobEnv.current()
    job = env.run_job(opts.job, kind)
    # NVML only where NVML's view is needed: --gpus (its indices) and user mode.
    chosen_from = load_inventory(settings.gpu_inventory) if opts.gpus is not None else None
    chosen = resolve_gpus(opts.gpus, chosen_from) if chosen_from and opts.gpus else None
    per_rank = _gpus_per_rank(opts, kind)
    admin, manifests = prolog_daemons(settings, env.node, job)
    if per_rank > 1:  # the prolog's daemons serve one GPU each: this run starts its own
        manifests = []
    if manifests and step and chosen is None:
        chosen_from = load_inventory(settings.gpu_inventory)
        chosen = visible_gpus(env, chosen_from)
    if manifests:
        inventory = chosen_from or _manifest_inventory(manifests, settings)
        slots = _restricted(admin.slots(inventory, manifests), chosen)
        if rank and chosen is None and env.is_real_step:  # a step's ranks: its GPUs only
            slots = step_slots(env.step_gpus, slots)
        running = {} if rank else admin.clients()
        return Plan(
            opts,
            settings,
            env,
            kind,
            job,
            admin,
            "prolog",
            inventory,
            tuple(slots),
            running,
            rank=rank,
        )
    daemons = JobDaemons(state.user_layout(settings, env.node, job), settings)
    state.check_user_tree(daemons.layout)
    inventory = chosen_from or load_inventory(settings.gpu_inventory)
    gpus = grouped(chosen if chosen is not None else visible_gpus(env, inventory), per_rank)
    keys = daemons.keys_for(gpus)
    daemons.check(keys)
    own = tuple(
        Slot.of(daemons.layout.gpu(k), g.uuid, inventory) for k, g in zip(keys, gpus, strict=True)
    )
    running = {} if rank or not daemons.live_manifests() else daemons.clients()
    return Plan(
        opts,
        settings,
        env,
        kind,
        job,
        daemons,
        "user",
        inventory,
        own,
        running,
        tuple(gpus),
        rank=rank,
    )


def _gpus_per_rank(opts: LaunchOptions, kind: str) -> int:
    """``--gpus-per-rank``, 1 by default; a farm's or calibrate's task runs on one GPU."""
    count = opts.gpus_per_rank or 1
    if count > 1 and kind in ("farm", "calibrate"):
        raise UsageError(
            f"--gpus-per-rank {count}: a {kind} runs each task on one GPU",
            hint="run programs of several GPUs with mpswrap run or a launcher",
        )
    return count


def grouped(gpus: Sequence[GpuInfo], per_rank: int) -> list[GpuInfo]:
    """The run's GPUs taken ``per_rank`` consecutive at a time, each group one daemon's
    (``GpuInfo.group``); refused unless they divide evenly."""
    if per_rank == 1:
        return list(gpus)
    if per_rank > len(gpus) or len(gpus) % per_rank:
        raise UsageError(
            f"--gpus-per-rank {per_rank}: the run has {len(gpus)} GPU(s)",
            cause="each rank takes that many, and the GPUs must divide into groups of it",
            hint="choose --gpus (or the step's GPUs) as a multiple of it",
        )
    return [GpuInfo.group(gpus[i : i + per_rank]) for i in range(0, len(gpus), per_rank)]


def _restricted(slots: list[Slot], chosen: list[GpuInfo] | None) -> list[Slot]:
    """The prolog's GPUs, restricted to ``--gpus`` or the step's."""
    if chosen is None:
        return slots
    wanted = {g.uuid for g in chosen}
    picked = [s for s in slots if s.uuid in wanted]
    if not picked:
        raise GpuError(
            "no MPS daemon for these GPUs",
            thing=", ".join(sorted(wanted)),
            cause="the job's daemons (prolog) serve other GPUs",
        )
    return picked


def _manifest_inventory(manifests: Sequence[Manifest], settings: Settings) -> Inventory:
    """The prolog's GPUs as their daemons' starter saw them (the manifests; looked up by UUID
    only, which a job's cgroup does not change), so that a rank joining them loads no NVML;
    NVML where a manifest has no GPU facts (an older mpswrap wrote it)."""
    try:
        found = inventory_from_json({"gpus": [m.gpu for m in manifests]}, "manifests")
    except GpuError:
        return load_inventory(settings.gpu_inventory)
    if [g.uuid for g in found.gpus] != [m.gpu_uuid for m in manifests]:
        return load_inventory(settings.gpu_inventory)
    return found


def local_position(env: JobEnv, policy: str) -> tuple[int, int, str]:
    """(local rank, local size, policy) of a rank by the innermost launcher's variables."""
    rank, size = env.local_rank, env.local_size
    if rank is None:
        return 0, max(size or 1, 1), policy
    if size is None or size <= rank:
        log.warning(
            "local rank %d but no usable local size (%s): placing ranks cyclically", rank, size
        )
        return rank, rank + 1, "cyclic"
    return rank, size, policy


# --- attach, run, finish ------------------------------------------------------------------------
class Result(Struct, frozen=True):
    """What a run's programs came to: the block of a ``Run`` sets it (``Run.result``)."""

    code: int  # the programs' exit code, as the run gives it
    #: One of them ran without MPS under ``--verify-attach fail`` (not a program's own 69).
    refused: bool = False


class Run:
    """A run between attach and leave, as the one context manager every way to run enters:
    ``with Run(planned, summary=...) as run:`` attaches (signals are only recorded until the
    block runs: attach and release always complete), the block runs the programs and sets
    ``run.result``, and leaving drops this owner's reference (the node's last owner stops
    user-mode daemons and hands the node's outcomes to ``summary``) and says in one line that
    a signal ended the run. ``run.code`` is then the run's exit code: the result's, or 1 where
    that is 0 and something of the job survived the teardown.

    ``counted``: a rank of a launch holds the prolog's daemons too, so that the node's last
    rank is known there as well. ``signals=False``: the program's own (``session()``, inside
    the user's process), nothing recorded; ``keep()`` then leaves the daemons running for a
    process that is still their client."""

    def __init__(
        self,
        planned: Plan,
        *,
        summary: Callable[[Released], None] | None = None,
        counted: bool = False,
        announce: bool = True,
        signals: bool = True,
    ) -> None:
        self.plan = planned
        self.summary = summary
        self.counted, self.announce, self.signals = counted, announce, signals
        self.start = planned.start  # when the run began (epoch seconds): the summary's clock
        self.trap = SignalTrap()
        self.att: Attachment | None = None
        self.result: Result | None = None
        self.code = 1
        self._kept = False
        #: How this owner's programs ended that are not in the job's run record yet.
        self.outcomes: list[Outcome] = []
        #: Those already in it (``ended``).
        self.recorded: list[Outcome] = []

    def __enter__(self) -> Run:
        if self.signals:
            self.trap.__enter__()
        try:
            self.att, self.plan = self.plan.attach(counted=self.counted)
        except BaseException:
            if self.signals:
                self.trap.__exit__(None, None, None)
            raise
        if self.announce:
            self.att.announce()
        return self

    @property
    def stopped(self) -> Result | None:
        """A terminating signal that came before the programs started: their result (they
        are not started)."""
        early = [s for s in self.trap.pop() if s in TERMINATING] if self.signals else []
        return Result(128 + early[0]) if early else None

    @property
    def attachment(self) -> Attachment:
        assert self.att is not None, "the run is entered"
        return self.att

    def daemon(self, slot: Slot) -> Daemon:
        return self.attachment.daemons.daemon(slot.key)

    def ended(self, *outcomes: Outcome) -> None:
        """Programs of the run ended: into the job's run record at once (one file for them
        all) where the run holds its job (user mode: ``status`` shows them while the run goes
        on, and the last owner's summary collects them), else kept for the summary of this
        owner alone."""
        att = self.attachment
        if not outcomes:
            return
        if att.ref is not None and records.save(att.layout, outcomes):
            self.recorded.extend(outcomes)
        else:
            self.outcomes.extend(outcomes)

    def keep(self) -> None:
        """Leave without releasing: this process is still a client of the daemons (its CUDA
        context lives until it exits); the watchdog stops them once its reference is stale."""
        self._kept = True

    def __exit__(self, *exc: object) -> None:
        try:
            left = 0 if self._kept else self._leave()
            self.code = self.result.code if self.result is not None else 1
            if self.signals:
                _say_interrupted(self.plan, self.code, self.trap, self.start)
            self.code = self.code or int(left > 0)
        finally:
            if self.signals:
                self.trap.__exit__(*exc)

    def _leave(self) -> int:
        """Leave the job's daemons, log what their teardown left behind and hand what leaving
        did to ``summary``; how many processes of the job survived the teardown. On the
        prolog's daemons there is no teardown to lose: the summary never fails such a rank."""
        att, planned = self.attachment, self.plan
        try:
            done: Released = leave(att, self.outcomes, recorded=self.recorded)
        except (MpswrapError, OSError) as exc:
            if att.mode == "user":
                raise
            log.warning("summary: this rank's outcome not recorded (%s)", exc)
            return 0
        log_teardown(done.teardown, f"{planned.kind} {planned.job}")
        if self.summary is not None:
            self.summary(done)
        return len(done.teardown.survivors()) if done.teardown else 0


def _say_interrupted(planned: Plan, code: int, trap: SignalTrap, start: float) -> None:
    """A run a terminating signal ended says so, once, in one line."""
    sig = trap.stopped_by
    if sig is None or code != 128 + sig:
        return
    log.warning(
        "%s %s: interrupted by %s after %.1f s: its programs were ended (their MPS clients "
        "by terminate_client first); exit code %d",
        planned.kind,
        planned.job,
        signal.Signals(sig).name,
        time.time() - start,
        code,
    )
