"""Root's pinned control socket (``rootrecord.pin_control``): a folder of root's that no
other user can list, holding a hard link of the daemon's socket; where the socket cannot be
pinned, or the pinned one is not the recorded one, root's commands reach no daemon at all."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpswrap.mps.rootrecord import Held, RootSide, pin_control, pinned_control

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root's folders are root's")


@pytest.fixture
def pipe(tmp_path: Path) -> Iterator[Path]:
    """A pipe directory with a listening control socket, as a daemon leaves it."""
    folder = tmp_path / "pipe"
    folder.mkdir()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(folder / "control"))
    listener.listen(1)
    (folder / "control_lock").write_text("")
    (folder / "nvidia-cuda-mps-control.pid").write_text("1\n")
    yield folder
    listener.close()


def _side(tmp_path: Path) -> RootSide:
    return RootSide(lock=None, record=tmp_path / "held.json", control=tmp_path / ".control")  # type: ignore[arg-type]


def _held(**fields: object) -> Held:
    return Held("g0", "GPU-x", 0, 0, "root", "prolog", **fields)  # type: ignore[arg-type]


def test_the_socket_is_pinned_in_a_folder_nobody_else_can_list(pipe: Path, tmp_path: Path) -> None:
    side = _side(tmp_path)
    pinned = pin_control(pipe, side.control, 0, os.getpid())  # type: ignore[arg-type]
    assert pinned is not None
    name, ident = pinned
    where = tmp_path / ".control" / name
    assert stat.S_IMODE(os.lstat(tmp_path / ".control").st_mode) == 0o711
    assert stat.S_IMODE(os.lstat(where).st_mode) == 0o755 and os.lstat(where).st_uid == 0
    assert len(name) == 16 and sorted(os.listdir(where)) == ["control", "control_lock"]
    st = os.lstat(where / "control")
    assert (st.st_dev, st.st_ino) == ident and os.lstat(pipe / "control").st_ino == ident[1]
    assert pinned_control(side, _held(pin=name, socket=ident)) == where


def test_a_control_that_is_no_socket_of_the_user_is_not_pinned(pipe: Path, tmp_path: Path) -> None:
    (pipe / "control").unlink()
    (pipe / "control").symlink_to(tmp_path / "elsewhere")
    assert pin_control(pipe, tmp_path / ".control", 0, os.getpid()) is None
    assert os.listdir(tmp_path / ".control") == []  # the new folder removed again


def test_a_hard_link_to_another_socket_is_not_pinned(pipe: Path, tmp_path: Path) -> None:
    """The job user's other job's socket, hard-linked in place of the daemon's before the
    pin: it has a name elsewhere too (that job's pipe, root's pin of it)."""
    other = tmp_path / "other"
    other.mkdir()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(other / "control"))
    (pipe / "control").unlink()
    os.link(other / "control", pipe / "control")
    try:
        assert pin_control(pipe, tmp_path / ".control", 0, os.getpid()) is None
    finally:
        listener.close()


@pytest.mark.parametrize("how", ["not pinned", "another socket", "folder gone"])
def test_commands_reach_no_daemon_where_the_pin_does_not_hold(
    pipe: Path, tmp_path: Path, how: str
) -> None:
    side = _side(tmp_path)
    pinned = pin_control(pipe, side.control, 0, os.getpid())  # type: ignore[arg-type]
    assert pinned is not None
    name, ident = pinned
    held = _held(pin=name, socket=ident)
    if how == "not pinned":
        held = _held(pin="", socket=None)
    elif how == "another socket":
        held = _held(pin=name, socket=(ident[0], ident[1] + 1))
    else:
        (tmp_path / ".control" / name / "control").unlink()
    where = pinned_control(side, held)
    assert where is not None and not where.exists() and where != pipe


def test_a_record_without_a_pin_uses_the_pipe(tmp_path: Path) -> None:
    """A daemon not answering yet, or a record an older mpswrap wrote."""
    assert pinned_control(_side(tmp_path), _held()) is None
    assert pinned_control(_side(tmp_path), None) is None
