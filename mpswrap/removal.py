"""Removing a tree its user controls, from root: through directory descriptors opened without
following a symlink, so whatever the user swaps in meanwhile, nothing outside the tree is
touched (a symlink met on the way is removed, never followed).

Any depth: at most ``MAX_OPEN`` descriptors are held while going down; a directory deeper
than that is first moved up to the tree's top (``renameat`` between two descriptors of the
tree, never a path) and removed from there in a later round. Any width: a directory is read
as it is removed (``os.scandir``), never listed whole, and the caller's deadline is looked at
every ``CHECK_EVERY`` entries at any depth; a tree not removed by then is named, with why.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

from ._struct import Struct, field
from ._wait import NO_DEADLINE, Deadline
from .paths import open_dir

__all__ = ["remove_tree"]

#: Directory descriptors held at once while going down a tree.
MAX_OPEN = 32
#: Rounds over the top of a tree: each takes what was moved up in the one before.
MAX_ROUNDS = 1 << 20
#: Entries removed between two looks at the deadline (a look costs a clock read).
CHECK_EVERY = 256
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
LATE = "not emptied within the teardown's deadline"


def remove_tree(path: Path, deadline: Deadline = NO_DEADLINE) -> str | None:
    """Remove ``path`` and everything under it; None when it is gone, else what is left and
    why. Through descriptors opened without following a symlink (one is removed, never
    followed): whatever the tree's user swaps in meanwhile, nothing outside it is touched."""
    try:
        parent = open_dir(path.parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"directory {path} ({exc.strerror or exc})"
    walk = _Walk(path, deadline)
    try:
        top = walk.open(parent, path.name, 0)
        if top is not None:
            try:
                _empty(walk, top)
            finally:
                os.close(top)
            walk.drop(os.rmdir, parent, path.name, 0)
    finally:
        os.close(parent)
    if not os.path.lexists(path):  # listed again: what is left is reported by name
        return None
    return f"directory {path} ({walk.problems[0] if walk.problems else 'still there'})"


class _Walk(Struct):
    """One removal: the tree's path, the deadline, what went wrong, how far it got."""

    shown: Path
    deadline: Deadline
    problems: list[str] = field(default_factory=list)
    #: Entries looked at, and removed or moved up, so far.
    looked: int = 0
    changed: int = 0
    #: The deadline passed: nothing more is looked at.
    late: bool = False

    def go_on(self) -> bool:
        """Whether to look at one more entry: the deadline is read every ``CHECK_EVERY``."""
        self.looked += 1
        if not self.late and self.looked % CHECK_EVERY == 0 and self.deadline.passed:
            self.late = True
            self.problems.insert(0, f"{self.shown}: {LATE}")  # the reason a report gives
        return not self.late

    def name(self, name: str, depth: int) -> str:
        """``name``, ``depth`` levels below the top, as a report names it."""
        if depth == 0:
            return str(self.shown)
        return f"{self.shown}/{name}" if depth == 1 else f"{self.shown}/.../{name}"

    def open(self, parent: int, name: str, depth: int) -> int | None:
        """A descriptor of the directory ``name`` below ``parent``; a file or symlink in its
        place is removed (None then, as when it is gone)."""
        try:
            return os.open(name, _LIST, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # a file or a symlink: it goes
                self.drop(os.unlink, parent, name, depth)
            elif exc.errno != errno.ENOENT:
                self.problems.append(f"{self.name(name, depth)}: {exc.strerror}")
            return None

    def drop(self, call: Callable[..., None], parent: int, name: str, depth: int) -> int:
        """unlink or rmdir ``name`` below ``parent``: 0 where it is gone, else the errno, the
        failure noted (but unlink's ``EISDIR``: a directory, which the caller then enters)."""
        try:
            call(name, dir_fd=parent)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            if exc.errno != errno.EISDIR:
                self.problems.append(f"{self.name(name, depth)}: {exc.strerror}")
            return exc.errno or errno.EIO
        self.changed += 1
        return 0


def _empty(walk: _Walk, top: int) -> None:
    """Remove everything below ``top``, in rounds: a round may move deep directories up.
    Rounds stop when the top is empty, the deadline passed, or one changed nothing."""
    for _ in range(MAX_ROUNDS):
        before = walk.changed
        _remove_below(walk, top, top, 1)
        if walk.late or _is_empty(top) or walk.changed == before:
            return


def _is_empty(fd: int) -> bool:
    with os.scandir(fd) as entries:
        return next(entries, None) is None


def _remove_below(walk: _Walk, top: int, fd: int, depth: int) -> None:
    """Remove what the directory ``fd`` holds (``depth`` levels below the top), entry by entry
    as it is read: a directory of millions of names is never held in memory."""
    with os.scandir(fd) as entries:
        for entry in entries:
            if not walk.go_on():
                return
            _remove(walk, top, fd, entry, depth)


def _remove(walk: _Walk, top: int, parent: int, entry: os.DirEntry[str], depth: int) -> None:
    """Remove ``entry`` below ``parent`` and what it holds; a directory at ``MAX_OPEN`` levels
    is moved up to the top instead, for a later round. What the directory's type says is not
    a directory is unlinked without being opened (unlink never follows a link)."""
    name = entry.name
    file = not entry.is_dir(follow_symlinks=False)
    if file and walk.drop(os.unlink, parent, name, depth) != errno.EISDIR:
        return  # gone, or why not is noted
    fd = walk.open(parent, name, depth)
    if fd is None:
        return
    try:
        if depth >= MAX_OPEN:
            _move_up(walk, top, parent, name, depth)
            return
        _remove_below(walk, top, fd, depth + 1)
    finally:
        os.close(fd)
    if not walk.late:
        walk.drop(os.rmdir, parent, name, depth)


def _move_up(walk: _Walk, top: int, parent: int, name: str, depth: int) -> None:
    """The directory ``name`` moves to the top, removed from there in a later round."""
    try:
        os.rename(name, f".mpswrap-deep-{os.urandom(6).hex()}", src_dir_fd=parent, dst_dir_fd=top)
    except OSError as exc:
        walk.problems.append(f"{walk.name(name, depth)}: {exc.strerror}")
    else:
        walk.changed += 1
