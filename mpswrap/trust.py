"""What root may read or run: files that only root can change (StrictModes for files).

Root's hooks read the admin config file and run programs: the MPS control binary and
``scontrol``. Whoever may change such a file, or any directory on the way to it, may make
root read their settings or run their code. So before root reads or runs one, its path is
walked from ``/`` one level at a time: every directory is root's and writable by no one else
(a sticky root-owned directory such as ``/tmp`` passes: nobody there may rename or remove what
another user owns), a symlink is followed only once the directory that holds it has passed,
and the file itself is a regular file of root's that neither group nor others may write.
Models: OpenSSH's ``safe_path()`` (StrictModes) and sudo's checks of sudoers.

Only root's own processes apply these checks: a user who runs mpswrap trusts what they like.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from .errors import ProcError, TrustError

__all__ = ["MAX_LINKS", "changeable_level", "check_root_file", "is_root", "program"]

#: Symlinks followed in one walk, as the kernel's own limit (ELOOP) does.
MAX_LINKS = 40
HINT = "make it, and every directory above it, root's and not writable by group or others"


def is_root() -> bool:
    return os.geteuid() == 0


def changeable_level(path: str | Path) -> str | None:
    """The first level of ``path`` that a user other than root may change, and why
    (``/opt/x (owned by uid 1001)``, ``/etc/m.conf (mode 0666)``); None if only root can."""
    # Not normalised: ``x/..`` is where the kernel goes, and x may be a link to elsewhere.
    parts = list(Path(os.getcwd(), path).parts[1:])
    here, links = Path("/"), 0
    problem = _problem(here, last=False)
    while parts and problem is None:
        part = parts.pop(0)
        if part == "..":
            here = here.parent  # checked on the way in: the walk resolved every link above
            continue
        level = here / part
        try:
            st = os.lstat(level)
        except OSError as exc:
            return f"{level} ({exc.strerror or exc})"
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid != 0:  # in a sticky directory its owner may replace it
                return f"{level} (a link owned by uid {st.st_uid})"
            links += 1
            if links > MAX_LINKS:
                return f"{level} (more than {MAX_LINKS} symbolic links)"
            target = Path(os.readlink(level))
            here = Path("/") if target.is_absolute() else here
            parts[:0] = list(target.parts[1:] if target.is_absolute() else target.parts)
            continue
        problem = _problem(level, last=not parts, st=st)
        here = level
    return problem


def _problem(level: Path, last: bool, st: os.stat_result | None = None) -> str | None:
    """Why another user may change ``level`` (a directory, or with ``last`` the file)."""
    st = st or os.lstat(level)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != 0:
        return f"{level} (owned by uid {st.st_uid})"
    if last and not stat.S_ISREG(st.st_mode):
        return f"{level} (not a regular file)"
    if not last and not stat.S_ISDIR(st.st_mode):
        return f"{level} (not a directory)"
    if mode & 0o022 and not (stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX):
        return f"{level} (mode {mode:04o})"
    return None


def check_root_file(path: str | Path, what: str) -> None:
    """Raise TrustError naming the level unless only root can change ``path`` (``what``: the
    file's role, e.g. "admin config file", "MPS control program")."""
    level = changeable_level(path)
    if level is not None:
        raise TrustError(
            f"{what} can be changed by a user other than root",
            thing=str(path),
            cause=level,
            hint=HINT,
        )


def program(name: str, search: str) -> str:
    """The absolute path of the program ``name`` on ``search`` (a PATH); as root, only one
    that no other user can change (``check_root_file``)."""
    found = shutil.which(name, path=search)
    if found is None:
        raise ProcError("program not found", thing=name, cause=f"not on {search}")
    if is_root():
        check_root_file(found, f"the program {name}")
    return found
