"""``trust``: what root may read or run. A file passes only where root alone can change it and
every directory above it, links followed only from a directory that passed (OpenSSH's
StrictModes, sudo's checks of sudoers). Owners other than root are made with chown, so these
run as root (CI does)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpswrap import trust
from mpswrap.errors import ProcError, TrustError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: two real users")
NOBODY = 65534


@pytest.fixture
def root() -> Iterator[Path]:
    """A directory of root's, 0755, below /tmp (root's, sticky)."""
    path = Path(tempfile.mkdtemp(prefix="trust-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    for sub in sorted(path.rglob("*"), reverse=True):
        if sub.is_dir() and not sub.is_symlink():
            sub.rmdir()
        else:
            sub.unlink()
    path.rmdir()


def _file(path: Path, mode: int = 0o644, uid: int = 0) -> Path:
    path.write_text("x\n")
    path.chmod(mode)
    os.chown(path, uid, -1)
    return path


def test_a_file_only_root_can_change_passes(root: Path) -> None:
    assert trust.changeable_level(_file(root / "conf")) is None
    trust.check_root_file(root / "conf", "admin config file")


@pytest.mark.parametrize(
    ("mode", "uid", "why"),
    [(0o666, 0, "mode 0666"), (0o664, 0, "mode 0664"), (0o644, NOBODY, f"owned by uid {NOBODY}")],
)
def test_a_file_others_can_write_or_own_is_named(root: Path, mode: int, uid: int, why: str) -> None:
    path = _file(root / "conf", mode, uid)
    assert trust.changeable_level(path) == f"{path} ({why})"
    with pytest.raises(TrustError) as caught:
        trust.check_root_file(path, "admin config file")
    assert caught.value.line() == (
        f"admin config file can be changed by a user other than root ({path}): {path} ({why})"
    )


@pytest.mark.parametrize(("mode", "uid"), [(0o777, 0), (0o775, 0), (0o755, NOBODY)])
def test_a_directory_above_it_that_others_can_change_is_named(
    root: Path, mode: int, uid: int
) -> None:
    level = root / "etc"
    level.mkdir()
    level.chmod(mode)
    os.chown(level, uid, -1)
    assert trust.changeable_level(_file(level / "conf")).startswith(f"{level} (")  # type: ignore[union-attr]


def test_a_sticky_root_directory_passes_as_tmp_does(root: Path) -> None:
    level = root / "tmp"
    level.mkdir()
    level.chmod(0o1777)
    assert trust.changeable_level(_file(level / "conf")) is None


def test_a_link_is_followed_only_from_a_directory_that_passed(root: Path) -> None:
    theirs = root / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, -1)
    _file(theirs / "real")
    (root / "link").symlink_to(theirs / "real")  # root's link into their directory
    assert trust.changeable_level(root / "link") == f"{theirs} (owned by uid {NOBODY})"
    (theirs / "back").symlink_to(root / "conf")  # their link to root's file
    _file(root / "conf")
    assert trust.changeable_level(theirs / "back") == f"{theirs} (owned by uid {NOBODY})"


def test_a_link_another_user_owns_is_named_even_in_a_sticky_directory(root: Path) -> None:
    """In a sticky directory a user may not replace root's entries, but their own link, yes."""
    sticky = root / "shared"
    sticky.mkdir()
    sticky.chmod(0o1777)
    _file(root / "real")
    (sticky / "ctl").symlink_to(root / "real")
    os.chown(sticky / "ctl", NOBODY, -1, follow_symlinks=False)
    assert (
        trust.changeable_level(sticky / "ctl") == f"{sticky / 'ctl'} (a link owned by uid {NOBODY})"
    )


def test_relative_links_and_dot_dot_resolve_as_the_kernel_does(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    _file(root / "a" / "conf")
    (root / "a" / "b" / "up").symlink_to("../conf")
    assert trust.changeable_level(root / "a" / "b" / "up") is None
    (root / "a" / "b").chmod(0o777)
    level = trust.changeable_level(root / "a" / "b" / ".." / "conf")
    assert level == f"{root / 'a' / 'b'} (mode 0777)"
    theirs = root / "theirs"
    (theirs / "d").mkdir(parents=True)
    os.chown(theirs, NOBODY, -1)
    (root / "l").symlink_to(theirs / "d")  # l/.. is their directory, not root's
    level = trust.changeable_level(root / "l" / ".." / "conf")
    assert level == f"{theirs} (owned by uid {NOBODY})"


def test_a_link_loop_or_a_missing_file_is_named(root: Path) -> None:
    (root / "loop").symlink_to(root / "loop")
    assert "symbolic links" in (trust.changeable_level(root / "loop") or "")
    assert (
        trust.changeable_level(root / "absent") == f"{root / 'absent'} (No such file or directory)"
    )


def test_something_other_than_a_regular_file_is_named(root: Path) -> None:
    os.mkfifo(root / "fifo", 0o600)
    assert trust.changeable_level(root / "fifo") == f"{root / 'fifo'} (not a regular file)"


def test_a_program_is_found_on_the_path_and_checked(root: Path) -> None:
    _file(root / "tool", 0o755)
    assert trust.program("tool", str(root)) == str(root / "tool")
    os.chown(root / "tool", NOBODY, -1)
    with pytest.raises(TrustError):
        trust.program("tool", str(root))
    with pytest.raises(ProcError):
        trust.program("absent", str(root))
