from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path

import pytest

from mpswrap.errors import ConfigError, LayoutError, MpswrapError, ProcError
from mpswrap.paths import JobLayout, ensure_private_dir


@pytest.mark.parametrize("job", ["../etc", "a/b", "..", "", "x" * 65, "-rf"])
def test_bad_job_ids(job: str) -> None:
    with pytest.raises(LayoutError, match="invalid job id"):
        JobLayout(Path("/run/mpswrap"), "n1", job)


def test_layout_paths() -> None:
    lay = JobLayout(Path("/run/mpswrap"), "node1", "123")
    g = lay.gpu("g0")
    assert g.pipe == Path("/run/mpswrap/node1/123/g0/pipe")
    assert g.manifest.name == "manifest.json"
    with pytest.raises(LayoutError):
        lay.gpu("GPU-abc/1")


def test_socket_path_limit() -> None:
    lay = JobLayout(Path("/" + "d" * 80), "node1", "123")
    with pytest.raises(LayoutError, match="too long for MPS sockets") as err:
        lay.gpu("g0").check_socket_length()
    assert "limit 107" in str(err.value)
    JobLayout(Path("/run/mpswrap"), "node1", "123").gpu("g0").check_socket_length()


def test_private_dir_mode_and_symlink_refusal(tmp_path: Path) -> None:
    made = ensure_private_dir(tmp_path / "job", os.getuid(), os.getgid())
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    ensure_private_dir(made, os.getuid(), os.getgid())  # idempotent
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(LayoutError, match="not a plain directory"):
        ensure_private_dir(tmp_path / "link", os.getuid(), os.getgid())
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    os.chmod(open_dir, 0o777)
    with pytest.raises(LayoutError, match="open to other users"):
        ensure_private_dir(open_dir, os.getuid(), os.getgid())


def test_wrong_owner_refused(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir(mode=0o700)
    with pytest.raises(LayoutError, match="wrong owner"):
        ensure_private_dir(tmp_path / "x", os.getuid() + 1, os.getgid())


def test_error_rendering_and_pickling() -> None:
    err = ProcError(
        "timed out",
        thing="nvidia-cuda-mps-control",
        cause="no answer in 5 s",
        hint="is the daemon alive?",
        argv=["a", "b"],
        returncode=None,
    )
    err.with_context("prolog")
    assert err.render() == (
        "mpswrap: prolog: timed out (nvidia-cuda-mps-control): "
        "no answer in 5 s\nhint: is the daemon alive?"
    )
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, ProcError) and isinstance(back, OSError)
    assert back.render() == err.render() and back.argv == ("a", "b")
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, MpswrapError)
