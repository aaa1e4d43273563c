"""Removing a tree its user controls, from root: through directory descriptors opened without
following a symlink, so whatever the user swaps in meanwhile, nothing outside the tree is
touched (a symlink met on the way is removed, never followed).

Any depth: at most ``MAX_OPEN`` descriptors are held while going down; a directory deeper
than that is first moved up to the tree's top (``renameat`` between two descriptors of the
tree, never a path) and removed from there in a later round. Every round draws on the
caller's deadline.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

from ._struct import Struct
from ._wait import NO_DEADLINE, Deadline
from .paths import open_dir

__all__ = ["remove_tree"]

#: Directory descriptors held at once while going down a tree.
MAX_OPEN = 32
#: Rounds over the top of a tree: each takes what was moved up in the one before.
MAX_ROUNDS = 1 << 20
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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
    problems: list[str] = []
    try:
        top = _open(parent, path.name, path, problems)
        if top is not None:
            try:
                _empty(top, path, problems, deadline)
            finally:
                os.close(top)
            _drop(os.rmdir, parent, path.name, path, problems)
    finally:
        os.close(parent)
    if not os.path.lexists(path):  # listed again: what is left is reported by name
        return None
    return f"directory {path} ({problems[0] if problems else 'still there'})"


def _open(parent: int, name: str, shown: Path, problems: list[str]) -> int | None:
    """A descriptor of the directory ``name`` below ``parent``; a file or symlink in its
    place is removed (None then, as when it is gone)."""
    try:
        return os.open(name, _LIST, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # a file or a symlink: the entry goes
            _drop(os.unlink, parent, name, shown, problems)
        elif exc.errno != errno.ENOENT:
            problems.append(f"{shown}: {exc.strerror}")
        return None


def _empty(top: int, shown: Path, problems: list[str], deadline: Deadline) -> None:
    """Remove everything below ``top``, in rounds: a round may move deep directories up."""
    for _ in range(MAX_ROUNDS):
        names = os.listdir(top)
        if not names or deadline.passed:
            if names:
                problems.append(f"{shown}: not emptied within the teardown's deadline")
            return
        before = len(problems)
        for name in names:
            _remove(_Walk(top, shown, problems), top, name, 1)
        if len(problems) > before and os.listdir(top) == names:
            return  # nothing more goes: the problems say why


class _Walk(Struct, frozen=True):
    """One round of removal: the tree's top (a descriptor), its path, what went wrong."""

    top: int
    shown: Path
    problems: list[str]


def _remove(walk: _Walk, parent: int, name: str, depth: int) -> None:
    """Remove ``name`` below ``parent`` (``depth`` levels below the top) and what it holds;
    a directory at ``MAX_OPEN`` levels is moved up to the top instead, for a later round."""
    shown = walk.shown.joinpath(name) if depth == 1 else Path(f"{walk.shown}/.../{name}")
    fd = _open(parent, name, shown, walk.problems)
    if fd is None:
        return
    try:
        if depth >= MAX_OPEN:
            try:
                os.rename(
                    name,
                    f".mpswrap-deep-{os.urandom(6).hex()}",
                    src_dir_fd=parent,
                    dst_dir_fd=walk.top,
                )
            except OSError as exc:
                walk.problems.append(f"{shown}: {exc.strerror}")
            return
        for entry in os.listdir(fd):
            _remove(walk, fd, entry, depth + 1)
    finally:
        os.close(fd)
    _drop(os.rmdir, parent, name, shown, walk.problems)


def _drop(call: Callable[..., None], parent: int, name: str, shown: Path, out: list[str]) -> None:
    """unlink or rmdir ``name`` below ``parent``; a failure is noted in ``out``."""
    try:
        call(name, dir_fd=parent)
    except FileNotFoundError:
        pass
    except OSError as exc:
        out.append(f"{shown}: {exc.strerror}")
