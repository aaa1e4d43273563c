"""Every file-system path mpswrap uses, and how root and users open, create and read them.

Layout: ``<run_dir>/<node>/<job id>/<gpu key>/{pipe,log,manifest.json}``. The node name is
always part of it (nodes may share a file system; the test cluster shares one machine). The
GPU key is short (``g0``): unix socket paths are limited to 107 bytes, MIG UUIDs contain ``/``.

Root works in directories job users own: all goes through descriptors opened level by level
from / (``open_dir``), a symlink anywhere refused, never followed; ``check_dirs`` is StrictModes.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ._struct import Struct
from .errors import LayoutError

__all__ = [
    "ROOT_ONLY",
    "SOCKET_PATH_MAX",
    "GpuDirs",
    "JobLayout",
    "check_dirs",
    "check_private_dir",
    "create_job_file",
    "ensure_private_dir",
    "ensure_shared_dir",
    "list_dir",
    "open_dir",
    "read_job_file",
    "uncreatable",
    "validate_name",
    "write_job_file",
]

log = logging.getLogger(__name__)

#: sun_path is 108 bytes including the terminating NUL.
SOCKET_PATH_MAX = 107
#: The longest socket name the MPS control daemon creates in its pipe directory.
LONGEST_SOCKET_NAME = "control_privileged"
MANIFEST = "manifest.json"
LOCK_SUFFIX = ".lock"
REFS = "refs"
SETTLE_SECONDS = 2.0  # a directory another creator made waits this long for its chown

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_KEY_RE = re.compile(r"^g[0-9]{1,3}$")
_PATH = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_STRICT_HINT = "run_dir must lie below directories only root (user mode: you) can write"
#: Who may own a directory root keeps its own state in.
ROOT_ONLY = frozenset({0})


def validate_name(kind: str, value: str) -> str:
    """A job id or node name must be one safe path component (no ``/``, no ``..``)."""
    if not _NAME_RE.fullmatch(value) or ".." in value:
        raise LayoutError(
            f"invalid {kind}",
            thing=repr(value),
            cause="expected letters, digits, '.', '_' or '-' (no '/' or '..'), at most 64",
        )
    return value


class GpuDirs(Struct, frozen=True):
    """The directories of one GPU's daemon inside a job."""

    key: str
    root: Path

    @property
    def pipe(self) -> Path:
        return self.root / "pipe"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def control_log(self) -> Path:
        return self.log / "control.log"

    @property
    def server_log(self) -> Path:
        return self.log / "server.log"

    @property
    def pid_file(self) -> Path:
        return self.pipe / "nvidia-cuda-mps-control.pid"

    def check_socket_length(self) -> None:
        longest = os.fsencode(str(self.pipe / LONGEST_SOCKET_NAME))
        if len(longest) > SOCKET_PATH_MAX:
            raise LayoutError(
                "pipe directory too long for MPS sockets",
                thing=str(self.pipe),
                cause=f"{len(longest)} bytes with '{LONGEST_SOCKET_NAME}', limit {SOCKET_PATH_MAX}",
                hint="set a shorter run_dir (e.g. /run/mpswrap)",
            )


class JobLayout(Struct, frozen=True):
    """Paths of one job on one node. ``owner``: who besides root may own run_dir and the
    levels above it (a user-mode tree's user); None: whoever runs this."""

    run_dir: Path
    node: str
    job_id: str
    owner: int | None = None

    def __post_init__(self) -> None:
        if not self.run_dir.is_absolute():
            raise LayoutError("run_dir must be absolute", thing=str(self.run_dir))
        validate_name("node name", self.node)
        validate_name("job id", self.job_id)

    @property
    def trusted(self) -> frozenset[int]:
        return frozenset({0, os.geteuid() if self.owner is None else self.owner})

    @property
    def node_dir(self) -> Path:
        return self.run_dir / self.node

    @property
    def job_dir(self) -> Path:
        return self.node_dir / self.job_id

    @property
    def refs_dir(self) -> Path:
        """Reference counts of user-mode owners (one file per owner PID)."""
        return self.job_dir / REFS

    def gpu(self, key: str) -> GpuDirs:
        if not _KEY_RE.match(key):
            raise LayoutError("invalid GPU key", thing=repr(key), cause="expected g<N>")
        return GpuDirs(key, self.job_dir / key)

    def gpu_keys(self, names: list[str]) -> list[str]:
        return sorted(name for name in names if _KEY_RE.fullmatch(name))

    def lock_path(self, key: str) -> Path:
        """The GPU's start/stop lock (root's in prolog mode: the job user cannot open it)."""
        return self.job_dir / f".{key}{LOCK_SUFFIX}"

    def ranks_lock_path(self, key: str) -> Path:
        """The lock ranks take to send control commands to the GPU's daemon one at a time; the
        job user creates it in the job directory it owns, in prolog and user mode alike."""
        return self.job_dir / f".{key}.ranks{LOCK_SUFFIX}"


# --- one level at a time, never through a symlink -----------------------------------------
def _why(exc: OSError) -> str:
    return "a symlink, not followed" if exc.errno == errno.ELOOP else exc.strerror or str(exc)


def _at(name: str, dir_fd: int, shown: Path, flags: int = _PATH) -> int:
    """Open the directory ``name`` below ``dir_fd``; a symlink or a file is refused."""
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            what = "refusing a path that is not a plain directory"
            raise LayoutError(what, thing=str(shown)) from exc
        raise


def open_dir(path: Path, trusted: frozenset[int] | None = None, flags: int = _PATH) -> int:
    """A descriptor (``O_PATH`` unless ``flags``) of the directory ``path``, each level opened
    below the last from / without following a symlink; with ``trusted``, each level must pass
    ``_strict``. Raises LayoutError, or OSError (FileNotFoundError: a level is missing)."""
    fd, shown = os.open("/", _PATH), Path("/")
    try:
        _strict(os.fstat(fd), shown, trusted)
        for part in Path(os.path.abspath(path)).parts[1:]:
            shown = shown / part
            old, fd = fd, _at(part, fd, shown)
            os.close(old)
            _strict(os.fstat(fd), shown, trusted)
        if flags != _PATH:
            old, fd = fd, os.open(".", flags, dir_fd=fd)
            os.close(old)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _strict(st: os.stat_result, shown: Path, trusted: frozenset[int] | None) -> None:
    """Owned by a trusted uid and writable by no one else; a sticky directory (/tmp) may be
    writable by all, as there nobody renames or removes what another user owns."""
    if trusted is None:
        return
    if st.st_uid not in trusted:
        what = "directory has the wrong owner"
        cause = f"owned by uid {st.st_uid}, expected {' or '.join(map(str, sorted(trusted)))}"
    elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        what = "directory is open to other users"
        cause = f"mode {stat.S_IMODE(st.st_mode):04o}: group or others may write to it"
    else:
        return
    raise LayoutError(what, thing=str(shown), cause=cause, hint=_STRICT_HINT)


@contextlib.contextmanager
def _failing(what: str, path: Path) -> Iterator[None]:
    """An OSError becomes a LayoutError naming ``path`` (its errno kept in ``fields``)."""
    try:
        yield
    except LayoutError:
        raise
    except OSError as exc:
        hint = "check run_dir exists and is writable" if exc.errno == errno.EACCES else None
        cause = exc.strerror or str(exc)
        raise LayoutError(what, thing=str(path), cause=cause, hint=hint, errno=exc.errno) from exc


def _open_at(path: Path, flags: int, mode: int = 0o644) -> int:
    """``path`` opened with ``flags`` below a descriptor of its directory (``open_dir``)."""
    parent = open_dir(path.parent)
    try:
        return os.open(path.name, flags, mode, dir_fd=parent)
    finally:
        os.close(parent)


def _unlink(path: Path) -> None:
    parent = open_dir(path.parent)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path.name, dir_fd=parent)
    finally:
        os.close(parent)


def check_dirs(path: Path, trusted: frozenset[int] | None) -> None:
    """StrictModes: every existing level of ``path`` from / is a real directory, owned by a uid
    in ``trusted`` and writable by no one else (``trusted`` None: no symlink is all); else a
    LayoutError names the first level that is not. Levels not there yet are checked as made."""
    with _failing("cannot open directory", path):
        try:
            os.close(open_dir(path, trusted))
        except FileNotFoundError:
            pass


def list_dir(path: Path, what: str = "cannot read directory") -> list[str] | None:
    """The names in the directory ``path``, None if it is not there."""
    with _failing(what, path):
        try:
            fd = open_dir(path, flags=_LIST)
        except FileNotFoundError:
            return None
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)


# --- creating -------------------------------------------------------------------------------
def ensure_private_dir(path: Path, uid: int, gid: int, mode: int = 0o700) -> Path:
    """Create ``path`` (one level) owned by uid/gid with ``mode``; an existing one must be a
    real directory with that owner and no extra permissions (a symlink is refused)."""
    return _ensure(path, mode, (uid, gid), lambda fd, st: _check_private(fd, st, path, uid, mode))


def check_private_dir(path: Path, uid: int, mode: int = 0o700) -> None:
    """What ``ensure_private_dir`` would refuse of ``path`` as it is now, changing nothing:
    a symlink or file in its place, another owner, permissions for others. A missing level
    passes (it would be made)."""
    with _failing("cannot check directory", path):
        try:
            parent = open_dir(path.parent)
        except FileNotFoundError:
            return
        try:
            fd = _at(path.name, parent, path, _LIST)
        except FileNotFoundError:
            return
        finally:
            os.close(parent)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
    _refuse_open(st, path, uid, mode)


def ensure_shared_dir(path: Path, trusted: frozenset[int], mode: int = 0o755) -> Path:
    """Create a parent that job users traverse (run_dir, node dir): ours, StrictModes."""
    owner = (os.geteuid(), os.getegid())
    return _ensure(path, mode, owner, lambda _fd, st: _strict(st, path, trusted))


def _ensure(
    path: Path, mode: int, owner: tuple[int, int], check: Callable[[int, os.stat_result], None]
) -> Path:
    """mkdir below a descriptor of the parent; the owner and mode are set (or, on a directory
    that was there, checked) through a descriptor of the new level."""
    with _failing("cannot create directory", path):
        parent, made = open_dir(path.parent), True
        try:
            try:
                os.mkdir(path.name, mode, dir_fd=parent)
            except FileExistsError:
                made = False
            fd = _at(path.name, parent, path, _LIST)
        finally:
            os.close(parent)
        try:
            check(fd, _own(fd, owner, mode) if made else _settled(fd, owner[0]))
        finally:
            os.close(fd)
    return path


def _own(fd: int, owner: tuple[int, int], mode: int) -> os.stat_result:
    """mkdir applied the umask: set the mode, and the owner where it is not us."""
    if owner != (os.geteuid(), os.getegid()):
        os.fchown(fd, *owner)
    os.fchmod(fd, mode)
    return os.fstat(fd)


def _settled(fd: int, uid: int) -> os.stat_result:
    """A directory of ours meant for ``uid`` is another creator's between its mkdir and its
    chown (two prologs of one job): wait for that, bounded."""
    st, deadline = os.fstat(fd), time.monotonic() + SETTLE_SECONDS
    while st.st_uid == os.geteuid() != uid and time.monotonic() < deadline:
        time.sleep(0.01)
        st = os.fstat(fd)
    return st


def _check_private(fd: int, st: os.stat_result, path: Path, uid: int, mode: int) -> None:
    """``uid``'s own and closed to others. Owner permissions taken from it (``chmod 500`` by
    its user) are given back by that user only: root never changes a job user's mode."""
    _refuse_open(st, path, uid, mode)
    bits = stat.S_IMODE(st.st_mode)
    if bits & 0o700 != mode & 0o700 and st.st_uid == os.geteuid():
        os.fchmod(fd, bits | (mode & 0o700))


def _refuse_open(st: os.stat_result, path: Path, uid: int, mode: int) -> None:
    """A private directory must be ``uid``'s own and give others nothing ``mode`` does not."""
    bits = stat.S_IMODE(st.st_mode)
    if st.st_uid != uid:
        raise LayoutError(
            "directory has the wrong owner",
            thing=str(path),
            cause=f"owned by uid {st.st_uid}, expected {uid}",
            hint="remove the stale directory (mpswrap stop / the epilog does this)",
        )
    if bits & ~mode & 0o077:
        cause = f"mode {bits:04o}, expected {mode:04o}"
        raise LayoutError(
            "directory is open to other users",
            thing=str(path),
            cause=cause,
            hint=f"chmod go-rwx {path}, or use another directory"
            if st.st_uid == os.geteuid()
            else None,
        )


def uncreatable(path: Path) -> str | None:
    """Why a directory could not be made at ``path`` (its missing levels too) and written in,
    as ``mkdir -p`` would say it; None where it could. Nothing is created (a dry run)."""
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    if not os.path.isdir(probe):
        return os.strerror(errno.ENOTDIR)
    if not os.access(probe, os.W_OK | os.X_OK):
        return os.strerror(errno.EACCES)
    if os.statvfs(probe).f_flag & os.ST_RDONLY:
        return os.strerror(errno.EROFS)
    kind = _fs_type(probe)
    if kind in KERNEL_FS:
        return f"{probe} is on {kind}, a file system of the kernel's"
    return None


#: File systems whose directories the kernel makes: no one else may (root included).
KERNEL_FS = frozenset(
    {
        "proc",
        "sysfs",
        "devpts",
        "securityfs",
        "debugfs",
        "pstore",
        "efivarfs",
        "fusectl",
        "binfmt_misc",
        "mqueue",
    }
)


def _fs_type(path: Path) -> str | None:
    """The type of the file system ``path`` lies on (``/proc/self/mountinfo``), or None."""
    real = os.path.realpath(path)
    best, kind = "", None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields, _, rest = line.partition(" - ")
                parts = fields.split()
                if len(parts) < 5 or not rest:
                    continue
                mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, rest.split()[0]
    except OSError:
        return None
    return kind


# --- the files of a job's directories -------------------------------------------------------
def read_job_file(path: Path, limit: int, *, tail: bool = False) -> str | None:
    """The text of ``path`` in a job's directories, which their user controls: never through a
    symlink nor blocking (a FIFO opens at once). None if absent or, with a warning, if no
    regular file of one link (else maybe a hard link to another's file) or over ``limit``
    bytes (``tail``: its last ``limit`` bytes, from a line start)."""
    try:
        fd = _open_at(path, _READ)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("not reading %s: %s", path, _why(exc))
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:  # before open(): a directory raises
        os.close(fd)
        log.warning("not reading %s: not a regular file of one link", path)
        return None
    with open(fd, "rb") as handle:
        if st.st_size > limit and not tail:
            log.warning("not reading %s: larger than %d bytes", path, limit)
            return None
        handle.seek(max(0, st.st_size - limit))
        data = handle.read(limit)
    if st.st_size > limit:
        data = data.partition(b"\n")[2]  # the first line is cut
    return data.decode(errors="replace")


def create_job_file(path: Path, mode: int = 0o644) -> int:
    """A descriptor of a new file ``path``, for writing: whatever was planted there goes first
    (the entry itself, never what a link points at)."""
    with _failing("cannot create file", path):
        _unlink(path)
        return _open_at(path, _NEW, mode)


def write_job_file(path: Path, text: str, uid: int, gid: int, mode: int = 0o644) -> None:
    """Replace ``path`` whole (a new file renamed over it: readers never see half of it),
    owned by uid/gid where we are root."""
    tmp = path.with_name(f".{path.name}.{os.urandom(4).hex()}")
    fd = create_job_file(tmp, mode)
    with _failing("cannot write file", path):
        try:
            with open(fd, "w") as handle:
                handle.write(text)
                if (uid, gid) != (os.geteuid(), os.getegid()) and os.geteuid() == 0:
                    os.fchown(fd, uid, gid)
                os.fchmod(fd, mode)
            parent = open_dir(path.parent)
            try:
                os.replace(tmp.name, path.name, src_dir_fd=parent, dst_dir_fd=parent)
            finally:
                os.close(parent)
        except BaseException:
            with contextlib.suppress(OSError):
                _unlink(tmp)
            raise


def farm_profile(setting: str, env: dict[str, str] | None = None) -> Path | None:
    """The caller's farm profile (``taskfarm.profile``) for the ``farm_profile`` setting: its
    file, or for ``auto`` ``$XDG_CACHE_HOME/mpswrap/farm-profile.json`` (``~/.cache``
    without it); None for ``off``, or ``auto`` without a home."""
    if setting == "off":
        return None
    if setting != "auto":
        return Path(setting)
    env = dict(os.environ) if env is None else env
    cache = env.get("XDG_CACHE_HOME") or (env["HOME"] + "/.cache" if env.get("HOME") else "")
    return Path(cache) / "mpswrap" / "farm-profile.json" if cache else None
