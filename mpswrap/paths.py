"""Every file-system path mpswrap uses, and their safe creation.

Layout: ``<run_dir>/<node>/<job id>/<gpu key>/{pipe,log,manifest.json}``. The node name is
always part of it because cluster nodes may share a file system (and the test cluster shares
one machine). The GPU key is short (``g0``) because unix socket paths are limited to 107 bytes
and MIG UUIDs may contain ``/``.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import LayoutError

__all__ = [
    "SOCKET_PATH_MAX",
    "GpuDirs",
    "JobLayout",
    "ensure_private_dir",
    "remove_tree",
    "validate_name",
]

#: sun_path is 108 bytes including the terminating NUL.
SOCKET_PATH_MAX = 107
#: The longest socket name the MPS control daemon creates in its pipe directory.
LONGEST_SOCKET_NAME = "control_privileged"
MANIFEST = "manifest.json"
LOCK_SUFFIX = ".lock"
REFS = "refs"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_KEY_RE = re.compile(r"^g[0-9]{1,3}$")


def validate_name(kind: str, value: str) -> str:
    """A job id or node name must be one safe path component (no ``/``, no ``..``)."""
    if not _NAME_RE.fullmatch(value) or ".." in value:
        raise LayoutError(
            f"invalid {kind}",
            thing=repr(value),
            cause="expected letters, digits, '.', '_' or '-' (no '/' or '..'), at most 64",
        )
    return value


@dataclass(frozen=True)
class GpuDirs:
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


@dataclass(frozen=True)
class JobLayout:
    """Paths of one job on one node."""

    run_dir: Path
    node: str
    job_id: str

    def __post_init__(self) -> None:
        if not self.run_dir.is_absolute():
            raise LayoutError("run_dir must be absolute", thing=str(self.run_dir))
        validate_name("node name", self.node)
        validate_name("job id", self.job_id)

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

    def create(self, uid: int, gid: int, *, shared_parents: bool) -> Path:
        """Create the job directory (owner uid/gid, 0700) and its parents.

        Admin mode (``shared_parents``): run_dir and node dir are root's, 0755, so job users can
        traverse them. User mode: every level is the user's own, 0700.
        """
        for parent in (self.run_dir, self.node_dir):
            if shared_parents:
                ensure_parent_dir(parent)
            else:
                ensure_private_dir(parent, uid, gid)
        return ensure_private_dir(self.job_dir, uid, gid)

    def gpu(self, key: str) -> GpuDirs:
        if not _KEY_RE.match(key):
            raise LayoutError("invalid GPU key", thing=repr(key), cause="expected g<N>")
        return GpuDirs(key, self.job_dir / key)

    def lock_path(self, key: str) -> Path:
        """The GPU's start/stop lock (root's in prolog mode: the job user cannot open it)."""
        return self.job_dir / f".{key}{LOCK_SUFFIX}"

    def ranks_lock_path(self, key: str) -> Path:
        """The lock ranks take to send control commands to the GPU's daemon one at a time; the
        job user creates it in the job directory it owns, in prolog and user mode alike."""
        return self.job_dir / f".{key}.ranks{LOCK_SUFFIX}"

    def existing_gpus(self) -> Iterator[GpuDirs]:
        """GPU directories present on disk, in key order."""
        try:
            names = sorted(os.listdir(self.job_dir))
        except FileNotFoundError:
            return
        except PermissionError as exc:
            raise LayoutError(
                "cannot read job directory", thing=str(self.job_dir), cause=exc.strerror
            ) from exc
        for name in names:
            # A symlink here was planted by the job's user: never follow it (root runs this).
            if _KEY_RE.fullmatch(name) and not os.path.islink(self.job_dir / name):
                yield GpuDirs(name, self.job_dir / name)


def _check_dir(path: Path, uid: int, mode: int) -> None:
    """An existing directory must be ``uid``'s own and closed to others. Owner permissions
    taken from it (a ``chmod 500`` by its user) are given back: a start needs them, and the
    directory is that user's anyway."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise LayoutError("refusing a path that is not a plain directory", thing=str(path))
    if st.st_uid != uid:
        raise LayoutError(
            "directory has the wrong owner",
            thing=str(path),
            cause=f"owned by uid {st.st_uid}, expected {uid}",
            hint="remove the stale directory (mpswrap stop / the epilog does this)",
        )
    if stat.S_IMODE(st.st_mode) & ~mode & 0o077:
        raise LayoutError(
            "directory is open to other users",
            thing=str(path),
            cause=f"mode {stat.S_IMODE(st.st_mode):04o}, expected {mode:04o}",
        )
    if stat.S_IMODE(st.st_mode) & 0o700 != mode & 0o700 and st.st_uid == os.geteuid():
        _give_back_owner_bits(path, st, mode)


def _give_back_owner_bits(path: Path, st: os.stat_result, mode: int) -> None:
    """chmod our own directory through a descriptor opened without following symlinks, and
    only if it is still the directory we looked at. Root never does this: it never changes
    a mode in a directory a job user controls."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise LayoutError("cannot open directory", thing=str(path), cause=exc.strerror) from exc
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            os.fchmod(fd, stat.S_IMODE(st.st_mode) | (mode & 0o700))
    finally:
        os.close(fd)


def remove_tree(path: Path) -> str | None:
    """Remove ``path`` and everything under it (never following a symlink); None when it is
    gone, else what is left and why, for the report."""
    errors: list[str] = []

    def note(_func: object, failed: str, info: object) -> None:
        exc = info[1] if isinstance(info, tuple) else info  # onerror: exc_info; onexc: exc
        errors.append(f"{failed}: {getattr(exc, 'strerror', None) or exc}")

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=note)
    else:  # pragma: no cover - Python < 3.12 has only onerror (deprecated from 3.12)
        shutil.rmtree(path, onerror=note)
    if not os.path.lexists(path):
        return None
    return f"directory {path} ({errors[0] if errors else 'still there'})"


def ensure_private_dir(path: Path, uid: int, gid: int, mode: int = 0o700) -> Path:
    """Create ``path`` (one level) owned by uid/gid with ``mode``, without following symlinks.

    An existing directory is accepted only if it is a real directory with that owner and no
    extra permissions: a symlink planted in a shared location is refused, never followed.
    """
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        _check_dir(path, uid, mode)
        return path
    except OSError as exc:
        raise LayoutError(
            "cannot create directory",
            thing=str(path),
            cause=exc.strerror or str(exc),
            hint="check run_dir exists and is writable" if exc.errno == errno.EACCES else None,
        ) from exc
    # mkdir applied the umask; set the mode and owner on the directory we just made, by fd
    # opened with O_NOFOLLOW so a swapped-in symlink cannot redirect the chown.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if (uid, gid) != (os.geteuid(), os.getegid()):
            os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return path


def ensure_parent_dir(path: Path, mode: int = 0o755) -> Path:
    """Create a shared parent (run_dir, node dir) traversable by job users; refuse symlinks."""
    try:
        os.makedirs(path, mode, exist_ok=True)
    except OSError as exc:
        raise LayoutError(
            "cannot create directory",
            thing=str(path),
            cause=exc.strerror or str(exc),
            hint="set run_dir to a writable directory (config key run_dir)",
        ) from exc
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise LayoutError("refusing a path that is not a plain directory", thing=str(path))
    return path
