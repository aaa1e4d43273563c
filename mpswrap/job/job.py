"""This job's daemons on this node: start, find, attach to, release and stop them.

Every entry point (the Slurm hooks, ``mpswrap start|stop|status``, the launcher, ``mpswrap
run``, ``session()``) starts and tears down through ``JobDaemons``, so all do it the same way.

User-mode ownership (``job.owners``): the first local rank starts the daemons under the job's
owner lock; every owner holds a reference; the last owner to release stops the daemons. A
watchdog (``job.watchdog``) stops them when every owner died without releasing; the Slurm
epilog sweeps whatever is still left. Per-rank supervisors hold a reference to the prolog's
daemons too (never stopped by them), so that the last rank of a node is known there as well:
it prints the node's summary (``report.summary``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from .. import _proc, _wait, trust
from .._struct import Struct, field
from ..config import Settings
from ..errors import DaemonError, LayoutError, MpswrapError, internal_error, one_line, shown
from ..jobenv import JobEnv
from ..mps.control import find_binary
from ..mps.daemon import Daemon, finish
from ..mps.gpu import GpuInfo, Inventory
from ..mps.manifest import Manifest
from ..mps.start import Defaults, log_started
from ..paths import JobLayout
from ..removal import remove_tree
from . import outcomes as records
from . import state
from .outcomes import Outcome
from .owners import add_ref, counted_ref, ensure_watchdog, live_refs, owner_lock
from .placement import Slot

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

    from ..mps.ladder import StopReport

__all__ = [
    "Attachment",
    "JobDaemons",
    "Released",
    "Teardown",
    "attach",
    "leave",
    "log_teardown",
    "prolog_daemons",
    "release",
]

log = logging.getLogger(__name__)


#: Seconds a user's own teardown needs at least (a Python start and its imports): with less
#: of the deadline left it is not run.
OWNER_STOP_LEAST = 0.5


class Teardown(Struct):
    """What stopping a job's daemons did, and what it could not remove."""

    job_dir: Path
    gpus: list[StopReport] = field(default_factory=list)
    #: What may still run: processes that survived, GPUs whose ladder could not run.
    left: list[str] = field(default_factory=list)
    #: Files that could not be removed, and a tree not entered: nothing of the job runs there.
    kept: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return all(r.clean for r in self.gpus) and not self.left and not self.kept

    def to_json(self) -> dict[str, Any]:
        """``stop --json``: each GPU's ladder (the job record's words), what was left."""
        return {
            "job_dir": str(self.job_dir),
            "gpus": [
                {"key": r.key, **r.ended(), "paths": r.paths, "notes": r.notes} for r in self.gpus
            ],
            "left": self.left,
            "kept": self.kept,
            "clean": self.clean,
        }

    def survivors(self) -> list[str]:
        """What of the job may still run, each naming what and where: the one thing that
        fails a teardown (the epilog's exit code, a run's). Files a user can keep from
        being removed are their own damage, never a reason to drain a node."""
        gpus = [f"{r.key}: {item}" for r in self.gpus for item in r.leftovers]
        return gpus + self.left

    def files(self) -> list[str]:
        """What could not be removed, or was not entered: no process of the job runs there."""
        return [f"{r.key}: {item}" for r in self.gpus for item in r.paths] + self.kept

    def problems(self) -> list[str]:
        """Everything left behind: the survivors, then the files."""
        return self.survivors() + self.files()

    def summary(self) -> list[str]:
        """One line per GPU: what its ladder did."""
        return [report.lines()[0] for report in self.gpus]

    def lines(self) -> list[str]:
        """The teardown as people read it, each line escaped: a control reply or a command
        line in it is the job user's text."""
        out = [line for report in self.gpus for line in report.lines()]
        return [one_line(x) for x in out + [f"LEFT BEHIND: {i}" for i in self.left + self.kept]]


class JobDaemons(Struct):
    """All per-GPU daemons of ``layout`` (one job on one node)."""

    layout: JobLayout
    settings: Settings

    def daemon(self, key: str) -> Daemon:
        """The daemon of GPU ``key``. Root's lock lives where only root writes (``state.
        root_lock``), and root takes no lock of the ranks': both would be files in a directory
        the job user owns, which that user could replace, hold or remove. For the daemons root
        starts (the prolog's, ``mpswrap start`` as root), root also keeps its own record and
        cgroup of each (``state.root_side``)."""
        lay = self.layout
        if self.roots:
            return Daemon(lay.gpu(key), state.root_side(self.settings, lay, key), self.settings)
        if trust.is_root() and lay.owner != 0:  # a user's own tree, which root looks at
            return Daemon(lay.gpu(key), state.root_lock(self.settings, lay, key), self.settings)
        return Daemon(lay.gpu(key), lay.lock_path(key), self.settings, lay.ranks_lock_path(key))

    @property
    def roots(self) -> bool:
        """Whether root starts and ends these daemons itself (a tree of root's, not a user's
        that root looks at): then root's record and cgroup say which processes are theirs."""
        return trust.is_root() and self.layout.owner is None

    def keys(self) -> list[str]:
        """The job's GPU keys: root's record's for a tree of root's (however many GPU
        directories the job user made), else the GPU directories there."""
        if self.roots:
            return state.recorded_keys(self.settings, self.layout)
        return [d.key for d in state.gpu_dirs(self.layout)]

    def manifests(self) -> list[Manifest]:
        found = (self.daemon(key).manifest() for key in self.keys())
        return [m for m in found if m]

    def keys_for(self, gpus: Sequence[GpuInfo]) -> list[str]:
        """Each GPU's key: the key whose daemon serves that GPU, else the
        first (``g0``, ``g1``, ...) that no manifest of another GPU holds. So a job's ranks
        that see different GPUs (one GPU a task) each get their own GPU's daemon, and a
        second ``start --gpus 1`` no longer finds GPU 0's at ``g0``. In root's trees, root's
        own records say which GPU a key serves, never a manifest (the job user writes those)."""
        if not os.path.lexists(self.layout.job_dir):  # a new job: nothing to read, or check
            return [f"g{i}" for i in range(len(gpus))]  # before the start's own checks
        if self.roots:
            records = ((key, self.daemon(key).held()) for key in self.keys())
            held = {h.gpu_uuid: key for key, h in records if h is not None}
        else:
            held = {m.gpu_uuid: m.key for m in self.manifests()}
        taken = set(held.values())
        keys = []
        for gpu in gpus:
            key = held.get(gpu.uuid) or next(
                k for k in (f"g{i}" for i in range(len(taken) + len(gpus))) if k not in taken
            )
            taken.add(key)
            keys.append(key)
        return keys

    def uuids(self) -> list[str]:
        """The GPUs of the daemons root started for the job (root's records; none for a
        user's tree)."""
        if not self.roots:
            return []
        held = (self.daemon(key).held() for key in self.keys())
        return [h.gpu_uuid for h in held if h]

    def live_manifests(self) -> list[Manifest]:
        """The manifests, if the job has daemons and every one of them runs; else none."""
        if not self.layout.job_dir.is_dir():
            return []
        manifests = self.manifests()
        return manifests if all(_proc.is_alive(m.daemon) for m in manifests) else []

    def check(self, keys: Sequence[str]) -> None:
        """Every check that can refuse a start, before anything is created (a dry run makes
        them too): the control program, the run directory, the sockets' path length."""
        find_binary(self.settings.control_binary)
        state.check_writable(self.layout)
        for key in keys:
            self.layout.gpu(key).check_socket_length()

    def start(
        self,
        gpus: Sequence[GpuInfo],
        user: _proc.UserIds,
        *,
        started_by: str,
        defaults: Defaults | Sequence[Defaults],
        shared_parents: bool,
        keys: Sequence[str] | None = None,
        allowed_cpus: frozenset[int] | None = None,
    ) -> list[Manifest]:
        """One daemon per GPU (``keys[i]`` or ``g<i>``), ``defaults`` one or one per GPU.

        All are launched before the first is waited for, and waited for side by side (each
        waits on its own daemon and driver); on any failure all are stopped.
        """
        keys = list(keys) if keys else self.keys_for(gpus)
        each = [defaults] * len(gpus) if isinstance(defaults, Defaults) else list(defaults)
        self.check(keys)
        state.create(self.layout, user.uid, user.gid, shared_parents=shared_parents)
        pending = []
        began, now = time.monotonic(), time.time()
        try:
            for key, gpu, gpu_defaults in zip(keys, gpus, each, strict=True):
                steps = self.daemon(key).starting(
                    gpu,
                    user,
                    node=self.layout.node,
                    job_id=self.layout.job_id,
                    started_by=started_by,
                    defaults=gpu_defaults,
                    allowed_cpus=allowed_cpus,
                )
                next(steps)  # launched, its lock held
                pending.append(steps)
            launched = time.monotonic()
            done = _wait.side_by_side([functools.partial(finish, steps) for steps in pending])
            log.debug(
                "%d daemon(s) launched in %.0f ms, all started %.0f ms later",
                len(pending),
                (launched - began) * 1000,
                (time.monotonic() - launched) * 1000,
            )
            started = [r for r in done if isinstance(r, Manifest)]
            for manifest in started:  # also those a failed GPU's start will stop
                if manifest.created >= now:  # not one already running (it said so)
                    log_started(manifest)
            failed = next((r for r in done if isinstance(r, BaseException)), None)
            if failed is not None:
                raise failed
            return started
        except BaseException:
            for steps in pending:  # stop what is half started and release its lock first
                steps.close()
            self.stop()
            raise

    def clients(self) -> dict[str, int]:
        """Running clients per GPU UUID (what a capacity check must count)."""
        return {m.gpu_uuid: len(self.daemon(m.key).clients()) for m in self.manifests()}

    def slots(
        self, inventory: Inventory | None, read: Sequence[Manifest] | None = None
    ) -> list[Slot]:
        """The job's GPUs as placement sees them (CPUs and memory where known)."""
        found = self.manifests() if read is None else read  # read: the caller's manifests
        return [Slot.of(self.layout.gpu(m.key), m.gpu_uuid, inventory) for m in found]

    def status(self, deadline: _wait.Deadline = _wait.NO_DEADLINE) -> dict[str, Any]:
        """The job's daemons as ``status`` shows them, every command drawn from ``deadline``."""
        return {
            "node": self.layout.node,
            "job": self.layout.job_id,
            "job_dir": str(self.layout.job_dir),
            "gpus": [self.daemon(key).status(deadline) for key in self.keys()[:GPUS_SHOWN]],
            "runs": _run_record(self.layout, deadline),
        }

    def stop(
        self,
        only_started_by: str | None = None,
        deadline: _wait.Deadline = _wait.NO_DEADLINE,
    ) -> Teardown:
        """The ladder for every GPU, then the job directory goes if nothing survived, all
        within ``deadline``. As root, for a tree of root's, what there is to end comes from
        root's record and cgroups (``keys``); a GPU whose ladder fails for any reason is
        ended by its cgroup or record all the same (``_end_anyway``). A tree that is not safe
        to enter (``state.check_safe``) is refused and named in ``kept``."""
        if trust.is_root() and self.layout.owner not in (None, 0):
            return self._stop_as_owner(deadline)
        done = Teardown(self.layout.job_dir)
        try:
            state.check_safe(self.layout)
            keys = self.keys()
        except LayoutError as exc:  # unsafe, or (root) not to be listed: a user's FUSE mount
            if exc.fields.get("errno") == errno.EACCES and not trust.is_root():
                raise  # not ours to see: another user's job
            done.kept.append(exc.line())
            if not self.roots:
                return done
            keys = state.recorded_keys(self.settings, self.layout)
        daemons = [(key, self.daemon(key)) for key in keys]
        if only_started_by:
            daemons = [(k, d) for k, d in daemons if _started_by(d) in (None, only_started_by)]
        # Side by side: each GPU's ladder waits on its own clients, daemon and driver.
        reports = _wait.side_by_side([functools.partial(d.stop, deadline) for _, d in daemons])
        for (key, daemon), report in zip(daemons, reports, strict=True):
            if isinstance(report, Exception):  # a GPU's teardown never leaves its daemon
                done.left += self._end_anyway(daemon, key, report)
            elif isinstance(report, BaseException):
                raise report
            else:
                done.gpus.append(report)
        if not self.keys():  # nothing of root's record left to end
            self._remove(done, deadline)
        return done

    def _stop_as_owner(self, deadline: _wait.Deadline) -> Teardown:
        """A user-mode tree root looks at (the epilog's sweep): its daemons are its user's own
        processes, named only by that user's files, so root runs that user's own teardown as
        them (``mpswrap stop`` of this tree), within ``deadline``, and never acts on those
        files itself. What it reports is the user's word: named in ``kept``, never a reason
        for root to fail (a user must not be able to drain a node)."""
        done = Teardown(self.layout.job_dir)
        lay = self.layout
        # Bounded even where the caller has no deadline (root's ``mpswrap stop``); never past
        # the caller's: less than a Python start takes, and it is not run at all.
        timeout = deadline.bound(self.settings.teardown_deadline)
        if timeout < OWNER_STOP_LEAST:
            done.kept.append(f"{lay.job_dir}: its user's teardown not run: no time left")
            return done
        # -s: no site directory of the user's (HOME is theirs: a .pth there runs at start).
        argv = [sys.executable, "-s", "-m", "mpswrap", "stop", "--job", lay.job_id]
        argv += ["--node", lay.node]
        argv += ["--run-dir", str(lay.run_dir)]
        try:
            user = _proc.lookup_user(lay.owner)
            env = {
                "PATH": _proc.SAFE_PATH,
                "LANG": "C",
                "HOME": user.home,
                "USER": user.name,
                "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                **{k: v for k, v in os.environ.items() if k.startswith("MPSWRAP_")},
            }
            res = _proc.run(argv, env=env, timeout=timeout, user=user, limit=1 << 20)
        except MpswrapError as exc:
            done.kept.append(f"{lay.job_dir}: its user's teardown: {exc.line()}")
            return done
        if res.returncode != 0:
            said = shown(one_line(res.stdout + res.stderr)[-400:], 400)
            done.kept.append(f"{lay.job_dir}: its user's teardown exited {res.returncode}: {said}")
        return done

    def _end_anyway(self, daemon: Daemon, key: str, exc: Exception) -> list[str]:
        """A GPU whose ladder failed (its lock held elsewhere past the bound, an error): what
        root knows of its daemon (cgroup, record) is ended by signal, and once nothing of it
        runs its directory and root's record go; what still runs is returned, named."""
        line = exc.line() if isinstance(exc, MpswrapError) else internal_error(exc, "at debug")
        log.debug("%s: ladder failed", key, exc_info=exc)
        identity = daemon.identity()
        if identity is None:
            return [f"{key}: {line}"]
        left = identity.end(_wait.Deadline(self.settings.teardown_deadline))
        log.warning("%s: teardown failed (%s): its daemon was ended by signal", key, line)
        if not left:
            daemon.forget(self.layout.gpu(key).root)
        return [f"{key}: {_proc.describe(p)} still running" for p in left]

    def _remove(self, done: Teardown, deadline: _wait.Deadline) -> None:
        """Once nothing of the job is left to end: the job's directory where every GPU's
        teardown was clean; root's own state of the job whatever became of that directory
        (``_release``); the node directory once empty."""
        if done.clean:
            problem = remove_tree(self.layout.job_dir, deadline)
            done.kept += [problem] if problem else []
        if self.roots:
            self._release(done, deadline)
        # The node directory goes once empty: a prolog that loses it to us between making
        # it and its job directory makes it again (state.create).
        with contextlib.suppress(OSError):
            os.rmdir(self.layout.node_dir)

    def _release(self, done: Teardown, deadline: _wait.Deadline) -> None:
        """Root's own state of a job it holds no daemon of any more: the job's cgroup, and
        the lock files an earlier teardown left (one whose job directory its user kept from
        being removed): a later epilog of the job cleans up what an earlier one left."""
        cgroup = state.job_cgroup(self.settings, self.layout)
        if cgroup is not None and not cgroup.remove():
            done.kept.append(f"cgroup {cgroup.path} (not removed)")
        for key in state.locked_keys(self.settings, self.layout):
            try:
                self.daemon(key).drop_lock(deadline)
            except MpswrapError as exc:  # held by another hook of the job: that one's
                done.kept.append(exc.line())


def _started_by(daemon: Daemon) -> str | None:
    """Who started ``daemon``: root's record's word, else the manifest's (None: unknown)."""
    held = daemon.held()
    if held is not None:
        return held.started_by
    manifest = _manifest_or_none(daemon)
    return manifest.started_by if manifest else None


def _run_record(layout: JobLayout, deadline: _wait.Deadline) -> dict[str, Any]:
    """How the job's programs that ended so far ended, from the run record (``job.outcomes``):
    what the node's summary line will count (what ``deadline`` leaves time to read)."""
    ended = records.peek(layout, deadline)
    codes = Counter(o.code for o in ended)
    return {"ended": len(ended), "exit_codes": {str(c): n for c, n in sorted(codes.items())}}


def _manifest_or_none(daemon: Daemon) -> Manifest | None:
    try:
        return daemon.manifest()
    except MpswrapError as exc:  # a torn or forged manifest must not stop the teardown
        log.warning("%s", exc.line())
        return None


# --- attach and release ----------------------------------------------------------------------
class Attachment(Struct):
    """The daemons a process may use, and how it holds them."""

    daemons: JobDaemons
    manifests: list[Manifest]
    mode: str  # "prolog" (admin daemons, never stopped by us) or "user"
    ref: Path | None = None

    @property
    def layout(self) -> JobLayout:
        return self.daemons.layout

    def announce(self) -> None:
        """Say which job this is and where its state lives (status and stop find it so)."""
        log.info(
            "job %s on %s: %d GPU daemon(s) (%s mode), state in %s",
            self.layout.job_id,
            self.layout.node,
            len(self.manifests),
            "user" if self.mode == "user" else "prolog",
            self.layout.job_dir,
        )


def prolog_daemons(settings: Settings, node: str, job: str) -> tuple[JobDaemons, list[Manifest]]:
    """The prolog's daemons of ``job`` and their manifests (none: no prolog started them, or
    one of them no longer runs)."""
    admin = JobDaemons(state.admin_layout(settings, node, job), settings)
    return admin, admin.live_manifests()


def attach(
    settings: Settings,
    env: JobEnv,
    job: str,
    *,
    gpus: Sequence[GpuInfo],
    keys: Sequence[str] | None = None,
    defaults: Defaults | None = None,
    counted: bool = False,
) -> Attachment:
    """Find the prolog's daemons of ``job``, or start (or join) user-mode ones on ``gpus``
    (each GPU at its key, ``JobDaemons.keys_for``; ``keys``: the plan's, checked before
    anything is created). A user-mode owner always holds a reference;
    ``counted``: a prolog-mode one too, so that ``leave`` can tell the node's last rank."""
    admin, manifests = prolog_daemons(settings, env.node, job)
    if manifests:
        return Attachment(
            admin, manifests, "prolog", counted_ref(admin.layout) if counted else None
        )
    if not gpus:  # planned on the prolog's daemons, which stopped before this attach
        raise DaemonError(
            "no MPS daemon to attach to",
            thing=f"job {job} on {env.node}",
            cause="the job's daemons stopped before this run attached",
        )
    daemons = JobDaemons(state.user_layout(settings, env.node, job), settings)
    keys = list(keys) if keys is not None else daemons.keys_for(gpus)
    state.check_user_tree(daemons.layout)  # before anything is created
    daemons.check(keys)
    user = _proc.lookup_user()
    with job_dir_held(daemons.layout, user, settings) as dir_id:
        # Again under the owner lock: a rank of the job on other GPUs may have started its
        # own since the plan was made (keys_for).
        keys = daemons.keys_for(gpus)
        daemons.check(keys)
        manifests = daemons.start(
            gpus,
            user,
            started_by="user",
            shared_parents=False,
            keys=keys,
            defaults=defaults or Defaults.from_settings(settings),
        )
        ref = add_ref(daemons.layout)
        ensure_watchdog(daemons.layout, dir_id, manifests)
    return Attachment(daemons, manifests, "user", ref)


#: GPU daemons of one job ``status`` asks about at most: a user-mode job's come from its
#: directories, which its user can multiply (a node has 8 or 16 GPUs).
GPUS_SHOWN = 64
#: Times a rank makes the user-mode job directory again where the job's last owner removed
#: it meanwhile.
JOIN_TRIES = 3


@contextlib.contextmanager
def job_dir_held(
    layout: JobLayout, user: _proc.UserIds, settings: Settings
) -> Iterator[tuple[int, int]]:
    """The user-mode job directory, made where missing, with its owner lock held: its identity
    (the directory the daemons' sockets go in).

    Another rank of the job that ended at once may, as the last owner it then was, remove the
    directory between this rank's making it and taking its lock (``leave``); the directory is
    then made again, at most ``JOIN_TRIES`` times.
    """
    for _ in range(JOIN_TRIES):
        state.create(layout, user.uid, user.gid, shared_parents=False)
        with owner_lock(layout.job_dir, settings.start_timeout * 4) as held:
            if held is not None:
                yield held
                return
    raise LayoutError(
        "job directory removed as it was made",
        thing=str(layout.job_dir),
        cause=f"{JOIN_TRIES} times: the job's last owner tore it down each time",
    )


class Released(Struct):
    """What leaving the job's daemons did."""

    att: Attachment
    #: The user-mode teardown, when this owner was the last (else None).
    teardown: Teardown | None = None
    #: Every outcome of the node's ranks, when this owner was the last to leave; else None.
    outcomes: list[Outcome] | None = None


def release(att: Attachment) -> Teardown | None:
    """Drop this owner's reference; the last owner stops the user-mode daemons (returns
    what that did; None when the daemons stay)."""
    return leave(att).teardown


def leave(
    att: Attachment, outcomes: Sequence[Outcome] = (), *, recorded: Sequence[Outcome] = ()
) -> Released:
    """``release``, with the outcomes of this owner's ranks: an owner that is not the last
    leaves them in the job directory (``outcomes.save``); the last, decided under the owner
    lock, collects every one left there. ``recorded``: this owner's outcomes already there
    (counted from the directory, or from here where the directory is gone). An owner
    without a reference (``mpswrap run`` on the prolog's daemons) is alone."""
    alone = Released(att, outcomes=[*recorded, *outcomes])
    if att.ref is None:
        return alone
    done = Released(att)
    with owner_lock(att.layout.job_dir, 30) as held:
        if held is None:  # the directory is gone, and with it every other owner's outcomes
            return alone
        att.ref.unlink(missing_ok=True)
        att.ref = None
        if live_refs(att.layout):
            records.save(att.layout, outcomes)
            return done
        done.outcomes = [*records.collect(att.layout), *outcomes]
        if att.mode == "user":
            done.teardown = att.daemons.stop()
    return done


def log_teardown(done: Teardown | None, context: str) -> None:
    """Leftovers of a teardown as errors, naming what and where."""
    for item in done.problems() if done else []:
        log.error("%s: left behind: %s", context, item)
