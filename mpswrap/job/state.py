"""Where a job's state lives: THE lookup of a job's directories, admin and user mode.

Admin mode (the Slurm prolog, ``mpswrap start`` as root): ``<run_dir>/<node>/<job>``.
User mode (``mpswrap run``, the launcher, ``session()``, ``mpswrap start``): the same below a
root of the user's own: ``user_run_dir`` if set, else ``$XDG_RUNTIME_DIR/mpswrap``, else
``/tmp/mpswrap-<uid>``. Whoever looks for a job (status, stop, the epilog, attach) asks this
module, so every caller finds the same directories.

Root enters a job's tree only where every level down to the node directory passes
StrictModes (``check_safe``): real directories of root's (or of a user-mode tree's user),
writable by no one else, so no other user can swap a level for a link to somewhere else.
"""

from __future__ import annotations

import errno
import glob
import itertools
import logging
import os
import re
import stat
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from .. import trust
from .._cgroup import Cgroup, parent_dir
from .._lock import RootLock
from ..config import Settings
from ..errors import ConfigError, LayoutError
from ..mps.gpu import Inventory, load_inventory
from ..mps.rootrecord import SUFFIX as RECORD_SUFFIX
from ..mps.rootrecord import RootSide, record_path
from ..paths import (
    ROOT_ONLY,
    GpuDirs,
    JobLayout,
    check_dirs,
    check_private_dir,
    ensure_private_dir,
    ensure_shared_dir,
    list_dir,
    uncreatable,
    validate_name,
)

__all__ = [
    "admin_layout",
    "check_safe",
    "check_user_tree",
    "check_writable",
    "create",
    "gpu_dirs",
    "job_cgroup",
    "job_layouts",
    "jobs_on_node",
    "layout_for",
    "node_inventory",
    "outcomes_dir",
    "recorded_keys",
    "root_lock",
    "root_side",
    "user_layout",
    "user_roots",
]


log = logging.getLogger(__name__)

#: The folder of rank outcome records in a job directory.
OUTCOMES = "outcomes"


def admin_layout(settings: Settings, node: str, job: str) -> JobLayout:
    return JobLayout(Path(settings.run_dir), node, job)


def layout_for(
    settings: Settings, node: str, job: str, *, admin: bool, run_dir: str | None = None
) -> JobLayout:
    """THE choice of where a start puts ``job``: ``run_dir`` where given (``mpswrap start
    --run-dir``), else root's run_dir for the hooks and root (``admin``), else this user's."""
    if run_dir:
        return JobLayout(Path(os.path.abspath(run_dir)), node, job)
    return admin_layout(settings, node, job) if admin else user_layout(settings, node, job)


def node_inventory(settings: Settings, node: str) -> Inventory:
    """The node's GPUs for root's prolog: NVML's answer, or the boot's copy of it,
    ``<run_dir>/inventory.<node>.json`` (``inventory_cache``; mps/inventory_cache). Only for
    hooks slurmd runs as root, outside the job's cgroup: a rank asks NVML for its own view."""
    kept = None
    if settings.inventory_cache:
        kept = Path(settings.run_dir) / f"inventory.{validate_name('node name', node)}.json"
    return load_inventory(settings.gpu_inventory, kept)


def compute_mode_file(settings: Settings, node: str, uuid: str) -> Path:
    """``<run_dir>/compute-mode.<node>.<GPU UUID>``: the mode a prolog found on a GPU before
    it made the GPU EXCLUSIVE_PROCESS, and the jobs that hold it so (exclusive_process)."""
    node, uuid = validate_name("node name", node), validate_name("GPU UUID", uuid)
    return Path(settings.run_dir) / f"compute-mode.{node}.{uuid}"


def compute_mode_lock(settings: Settings, node: str) -> Path:
    """The lock around every change of a node's compute-mode files and modes."""
    return Path(settings.run_dir) / f".compute-mode.{validate_name('node name', node)}.lock"


#: Root's locks, below run_dir: a directory only root can write (never a job user's).
ROOT_LOCKS = ".locks"
#: Root's pinned control sockets (``rootrecord.pin_control``), below run_dir: a directory
#: only root can write or list, that job users may pass through (mode 0711).
ROOT_CONTROL = ".control"


def root_lock(settings: Settings, layout: JobLayout, key: str) -> RootLock:
    """The start/stop lock root takes on one GPU's daemon of ``layout`` (admin or user mode):
    ``<run_dir>/.locks/<node>.<job>.<key>[.u<uid>].lock``, mode 0700 directory of root's."""
    locks = _root_dir(settings)
    admin = admin_layout(settings, layout.node, layout.job_id)

    def prepare() -> None:
        create_run_dir(admin)
        ensure_shared_dir(locks, ROOT_ONLY, mode=0o700)

    name = f"{_root_stem(layout)}.{layout.gpu(key).key}{_owner_part(layout)}.lock"
    return RootLock(locks / name, settings.start_timeout * 4, prepare)


def root_side(settings: Settings, layout: JobLayout, key: str) -> RootSide:
    """Root's own state of one GPU's daemon of a job root starts daemons for: its lock, its
    record (``mps.rootrecord``) and the cgroup it starts the daemon in (``job_cgroup``)."""
    lock = root_lock(settings, layout, key)
    cgroup = job_cgroup(settings, layout)
    leaf = Cgroup(cgroup.path / layout.gpu(key).key) if cgroup else None
    return RootSide(lock, record_path(lock.path), leaf, Path(settings.run_dir) / ROOT_CONTROL)


def job_cgroup(settings: Settings, layout: JobLayout) -> Cgroup | None:
    """``<cgroup_root>/<node>.<job>.<run_dir's checksum>``: the cgroup of root's that holds a
    job's daemons, one cgroup per GPU below it (None: ``cgroup_root = none``, or no cgroup2
    mounted). The checksum keeps apart two run directories on one machine (two slurmd of
    one host with their own, the tests' simulated nodes)."""
    parent = parent_dir(settings.cgroup_root)
    if parent is None:
        return None
    where = zlib.crc32(os.fsencode(str(layout.run_dir)))
    return Cgroup(parent / f"{_root_stem(layout)}.{where:08x}")


def recorded_keys(settings: Settings, layout: JobLayout) -> list[str]:
    """The GPU keys root holds a record or a cgroup of for ``layout``: what root's teardown
    acts on, however many GPU directories the job user made. Root's record is read only
    while its folder is root's alone (``paths.check_dirs``)."""
    keys = _keys_in_root_dir(settings, layout, RECORD_SUFFIX)
    cgroup = job_cgroup(settings, layout)
    if cgroup is not None and cgroup.exists():
        keys.update(entry.name for entry in os.scandir(cgroup.path) if entry.is_dir())
    return layout.gpu_keys(sorted(keys))


def locked_keys(settings: Settings, layout: JobLayout) -> list[str]:
    """The GPU keys of ``layout`` that root has a lock file of (``root_lock``)."""
    return layout.gpu_keys(sorted(_keys_in_root_dir(settings, layout, ".lock")))


def _keys_in_root_dir(settings: Settings, layout: JobLayout, suffix: str) -> set[str]:
    """The keys in the names ``<node>.<job>.<key>[.u<uid>]<suffix>`` of root's own folder
    (none where it is not root's alone)."""
    prefix, suffix = f"{_root_stem(layout)}.", f"{_owner_part(layout)}{suffix}"
    try:
        check_dirs(_root_dir(settings), ROOT_ONLY)
        names = os.listdir(_root_dir(settings))
    except (LayoutError, OSError):
        names = []
    return {
        n[len(prefix) : -len(suffix)] for n in names if n.startswith(prefix) and n.endswith(suffix)
    }


def _root_dir(settings: Settings) -> Path:
    return Path(settings.run_dir) / ROOT_LOCKS


def _root_stem(layout: JobLayout) -> str:
    return f"{layout.node}.{layout.job_id}"


def _owner_part(layout: JobLayout) -> str:
    return "" if layout.owner is None else f".u{layout.owner}"


def user_root(settings: Settings, uid: int, env: Mapping[str, str]) -> Path:
    """The root a user-mode start of ``uid`` uses now: ``user_run_dir``, else
    ``$XDG_RUNTIME_DIR/mpswrap``, else ``/tmp/mpswrap-<uid>`` unless another user made that
    first (anyone may create a name in /tmp): then ``~/.mpswrap-run``, with one warning."""
    if settings.user_run_dir:
        return Path(settings.user_run_dir)
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg) and uid == os.getuid() and _own_dir(xdg, uid):
        return Path(xdg) / "mpswrap"
    shared = Path(f"/tmp/mpswrap-{uid}")
    squatter = _squatted(shared, uid)
    if squatter is None:
        return shared
    private = _home_root(uid)
    if shared not in _WARNED:
        _WARNED.add(shared)
        log.warning(
            "%s is not yours (%s): using %s instead (remove %s, or set user_run_dir)",
            shared,
            squatter,
            private,
            shared,
        )
    return private


#: Squatted /tmp roots already named in a warning (once a process).
_WARNED: set[Path] = set()


def _squatted(path: Path, uid: int) -> str | None:
    """Why ``path`` cannot be ``uid``'s user-mode root (another user's, a link, open to
    others), None when it is free or ``uid``'s own."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o077:
        return f"mode {stat.S_IMODE(st.st_mode):04o}"
    return None


def _home_root(uid: int) -> Path:
    """``<home>/.mpswrap-run``: a user-mode root no other user can make first."""
    import pwd

    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        home = f"/nonexistent-home-{uid}"
    return Path(home) / ".mpswrap-run"


def _own_dir(path: str, uid: int) -> bool:
    """Whether ``path`` is a real directory of ``uid`` (an inherited ``XDG_RUNTIME_DIR`` of
    another user, after su or sudo, is not: the /tmp root is used instead)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid


def user_layout(
    settings: Settings, node: str, job: str, env: Mapping[str, str] | None = None
) -> JobLayout:
    """Where a user-mode start by this process puts ``job``."""
    return JobLayout(user_root(settings, os.getuid(), env or os.environ), node, job, os.getuid())


def user_roots(settings: Settings, uid: int, env: Mapping[str, str] | None = None) -> list[Path]:
    """Every root a user-mode start of ``uid`` may have used (its environment may differ
    from ours: a root epilog sees none of the job's variables)."""
    roots = [user_root(settings, uid, env or os.environ), Path(f"/run/user/{uid}/mpswrap")]
    roots += [Path(f"/tmp/mpswrap-{uid}"), _home_root(uid)]
    roots += [Path(settings.user_run_dir)] if settings.user_run_dir else []
    return list(dict.fromkeys(roots))


def owned_by(layout: JobLayout, uid: int) -> bool:
    """A user-mode layout counts only as real directories (no symlink) owned by ``uid``:
    root must never act on a directory another user planted."""
    for path in (layout.run_dir, layout.node_dir, layout.job_dir):
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            return False
    return True


def job_layouts(
    settings: Settings, node: str, job: str, uid: int, run_dir: str | None = None
) -> list[JobLayout]:
    """The existing directories of ``job`` on ``node``: an explicit ``run_dir``; else the
    admin layout and the user-mode layouts that belong to ``uid``."""
    if run_dir:
        layouts = [JobLayout(Path(os.path.abspath(run_dir)), node, job)]
    else:
        admin = admin_layout(settings, node, job)
        users = [JobLayout(root, node, job, uid) for root in user_roots(settings, uid)]
        layouts = [admin, *(lay for lay in users if lay.run_dir != admin.run_dir)]
        layouts = [admin, *(lay for lay in layouts[1:] if owned_by(lay, uid))]
    return [lay for lay in layouts if _present(lay) or _held_by_root(settings, lay)]


def _held_by_root(settings: Settings, layout: JobLayout) -> bool:
    """Whether root holds a record or cgroup of the job there (its directory may be gone)."""
    return trust.is_root() and layout.owner is None and bool(recorded_keys(settings, layout))


def _present(layout: JobLayout) -> bool:
    """The job has a directory there, or its tree is unsafe to look into (whoever acts on
    the layout then refuses, naming the level, and ends what runs there). A tree a user may
    not even search is none of theirs; root is refused only by what a user mounted there
    (FUSE), which hides the job from no one: it is unsafe, so present."""
    try:
        check_safe(layout)
    except LayoutError as exc:
        return exc.fields.get("errno") != errno.EACCES or trust.is_root()
    try:
        os.lstat(layout.job_dir)
    except OSError as exc:
        return exc.errno != errno.ENOENT and trust.is_root()
    return True


#: User-mode roots, and jobs of one on a node, that a listing of every job takes at most: any
#: local user can make both, and root's ``status`` reads each (a user runs a few at a time).
USER_ROOTS_LIMIT, USER_JOBS_LIMIT = 1024, 64
#: Where user-mode roots of every user are (root's listing): the uid is in the path.
USER_ROOT_GLOBS = (
    (re.compile(r"^/tmp/mpswrap-([0-9]+)$"), "/tmp/mpswrap-*"),
    (re.compile(r"^/run/user/([0-9]+)/mpswrap$"), "/run/user/*/mpswrap"),
)


def jobs_on_node(settings: Settings, node: str, uid: int | None) -> list[JobLayout]:
    """Every job with state on ``node`` that belongs to ``uid`` (None: every user's).

    Admin jobs live below root's run_dir; a user-mode job counts only where ``owned_by`` its
    root's user (the epilog's rule): root never acts on a directory another user planted.
    """
    admin = [
        lay
        for lay in _jobs_under(Path(settings.run_dir), node, None)
        if uid is None or _owner(lay.job_dir) == uid
    ]
    users = [
        lay
        for root, owner in _user_roots_of(settings, uid)[:USER_ROOTS_LIMIT]
        for lay in itertools.islice(_jobs_under(root, node, owner), USER_JOBS_LIMIT)
        if owned_by(lay, owner)
    ]
    found = {lay.job_dir: lay for lay in reversed([*admin, *users])}
    return sorted(found.values(), key=lambda lay: (str(lay.run_dir), lay.job_id))


def _user_roots_of(settings: Settings, uid: int | None) -> list[tuple[Path, int]]:
    """(user-mode root, the uid it belongs to): ``uid``'s, or every user's (uid None)."""
    if uid is not None:
        return [(root, uid) for root in user_roots(settings, uid)]
    found = []
    for pattern, wildcard in USER_ROOT_GLOBS:
        for path in sorted(glob.glob(wildcard)):
            match = pattern.match(path)
            # Only a directory of the user its name says: one user's many names in /tmp take
            # no place of another user's root in the limit.
            if match and _is_dir_of(Path(path), int(match.group(1))):
                found.append((Path(path), int(match.group(1))))
    shared = settings.user_run_dir
    owner = _owner(Path(shared)) if shared else None
    return found + ([(Path(shared), owner)] if shared and owner is not None else [])


def _jobs_under(root: Path, node: str, owner: int | None) -> Iterator[JobLayout]:
    try:
        names = sorted(os.listdir(root / node))
    except OSError:
        return
    for name in names:
        try:
            layout = JobLayout(root, node, validate_name("job id", name), owner)
        except LayoutError:
            continue  # a lock file or something that is no job of mpswrap's
        if stat.S_ISDIR(_lstat_mode(layout.job_dir)):
            yield layout


def _lstat_mode(path: Path) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def _is_dir_of(path: Path, uid: int) -> bool:
    """``path`` is a directory (not a link to one) that ``uid`` owns."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == uid


def _owner(path: Path) -> int | None:
    try:
        return os.lstat(path).st_uid
    except OSError:
        return None


def check_writable(layout: JobLayout) -> None:
    """Fail early, creating nothing, when run_dir cannot be created or written: a path a
    setting or an option gave, so a bad value of it (exit 2). No level above run_dir is
    made."""
    probe = layout.run_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    what = cause = ""
    if not os.access(probe, os.W_OK | os.X_OK):
        what, cause = "run directory not writable", f"{probe} is not writable by uid {os.geteuid()}"
    elif not layout.run_dir.parent.is_dir():
        what, cause = "cannot create the run directory", f"{layout.run_dir.parent} does not exist"
    elif why := uncreatable(layout.run_dir):
        what, cause = "cannot create the run directory", why
    if cause:
        raise ConfigError(
            what,
            thing=str(layout.run_dir),
            cause=cause,
            hint=RUN_DIR_HINT,
        )


def check_user_tree(layout: JobLayout) -> None:
    """Everything ``create`` of a user-mode layout would refuse, refused with nothing
    created: run_dir not writable, a level above it others may change, an existing level
    that is not this user's own and closed to others (a dry run and a real start refuse
    alike)."""
    check_writable(layout)
    try:
        check_dirs(layout.run_dir.parent, layout.trusted)
        for level in (layout.run_dir, layout.node_dir, layout.job_dir):
            check_private_dir(level, os.getuid())
    except LayoutError as exc:
        raise _bad_setting(exc) from exc


def check_safe(layout: JobLayout) -> None:
    """Refuse to enter the job's tree, with a LayoutError naming the level, unless every level
    down to the node directory passes StrictModes (``paths.check_dirs``) and the job
    directory, where there, is a real one."""
    check_dirs(layout.node_dir, layout.trusted)
    check_dirs(layout.job_dir, None)


def gpu_dirs(layout: JobLayout) -> list[GpuDirs]:
    """The job's GPU entries in key order, symlinks planted in place of one included: whoever
    stops one refuses to follow it (``mps.ladder``), and reads go through ``read_job_file``."""
    check_safe(layout)
    names = list_dir(layout.job_dir, "cannot read job directory") or []
    return [layout.gpu(key) for key in layout.gpu_keys(names)]


def outcomes_dir(layout: JobLayout) -> Path:
    """Records of how the node's ranks ended, until the last rank sums them up
    (``job.outcomes``): the job user's, in prolog and user mode alike (the job directory is
    theirs in both), and removed with the job directory."""
    return layout.job_dir / OUTCOMES


#: Rounds of making a job directory whose node directory another job's epilog removes.
CREATE_TRIES = 5


def create(layout: JobLayout, uid: int, gid: int, *, shared_parents: bool) -> Path:
    """Create the job directory (owner uid/gid, 0700) and its parents.

    Admin mode (``shared_parents``): run_dir (and missing levels above it) and the node dir
    are root's, 0755, so job users can traverse them. User mode: run_dir and node dir are the
    user's own, 0700. Another job's epilog removes the node directory once it is empty, and
    without PrologFlags=Alloc it may do so between our making it and the job directory in
    it: that ENOENT starts a new round (bounded); with our job directory in it, it stays.
    """
    try:
        for _ in range(CREATE_TRIES - 1):
            try:
                return _create(layout, uid, gid, shared_parents)
            except LayoutError as exc:
                if exc.fields.get("errno") != errno.ENOENT:
                    raise
        return _create(layout, uid, gid, shared_parents)
    except LayoutError as exc:
        if shared_parents:
            raise
        raise _bad_setting(exc) from exc


#: Where a user-mode run directory comes from.
RUN_DIR_HINT = "set run_dir / user_run_dir, or MPSWRAP_USER_RUN_DIR"


def _bad_setting(exc: LayoutError) -> ConfigError:
    """A level of a user's own run directory that cannot be used: a path a setting, a
    variable or an option gave, so a bad value of it (exit 2)."""
    return ConfigError(
        exc.what, thing=exc.thing, cause=exc.cause, hint=exc.hint or RUN_DIR_HINT, **exc.fields
    )


def create_run_dir(layout: JobLayout) -> Path:
    """run_dir of an admin layout, and missing levels above it: root's, 0755."""
    check_dirs(layout.run_dir.parent, layout.trusted)
    above = list(reversed(layout.run_dir.parents))[1:]  # "/" is there
    for level in [*above, layout.run_dir]:
        ensure_shared_dir(level, layout.trusted)
    return layout.run_dir


def _create(layout: JobLayout, uid: int, gid: int, shared_parents: bool) -> Path:
    if shared_parents:
        create_run_dir(layout)
        ensure_shared_dir(layout.node_dir, layout.trusted)
    else:
        check_dirs(layout.run_dir.parent, layout.trusted)
        for level in (layout.run_dir, layout.node_dir):
            ensure_private_dir(level, uid, gid)
    return ensure_private_dir(layout.job_dir, uid, gid)
