"""Removing a tree its user controls, from root: through directory descriptors opened without
following a symlink, so whatever the user swaps in meanwhile, nothing outside the tree is
touched (a symlink met on the way is removed, never followed)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

from .paths import open_dir

__all__ = ["remove_tree"]

#: How deep ``remove_tree`` goes (mpswrap makes 3 levels below a job directory).
MAX_DEPTH = 64
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: Path) -> str | None:
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
        _remove_at(parent, path.name, path, problems, 0)
    finally:
        os.close(parent)
    if not os.path.lexists(path):  # listed again: what is left is reported by name
        return None
    return f"directory {path} ({problems[0] if problems else 'still there'})"


def _remove_at(parent: int, name: str, shown: Path, problems: list[str], depth: int) -> None:
    try:
        fd = os.open(name, _LIST, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # a file or a symlink: the entry goes
            _drop(os.unlink, parent, name, shown, problems)
        elif exc.errno != errno.ENOENT:
            problems.append(f"{shown}: {exc.strerror}")
        return
    try:
        if depth >= MAX_DEPTH:
            problems.append(f"{shown}: nested deeper than {MAX_DEPTH} levels")
            return
        for entry in os.listdir(fd):
            _remove_at(fd, entry, shown / entry, problems, depth + 1)
    finally:
        os.close(fd)
    _drop(os.rmdir, parent, name, shown, problems)


def _drop(call: Callable[..., None], parent: int, name: str, shown: Path, out: list[str]) -> None:
    """unlink or rmdir ``name`` below ``parent``; a failure is noted in ``out``."""
    try:
        call(name, dir_fd=parent)
    except FileNotFoundError:
        pass
    except OSError as exc:
        out.append(f"{shown}: {exc.strerror}")
