"""`mpswrap install-hooks` refuses what a user other than root could change: root runs the
interpreter, the mpswrap package and the config file on every job, so whoever may write one
of them (or a directory above it) would run code as root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.simenv import ensure_test_user

pytestmark = [
    pytest.mark.functional,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="installs hooks as root, owned by a test user"),
]


def _install(tmp: Path, python: str, config: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "mpswrap", "install-hooks", "--python", python,
            "--config", str(config), "--dest", str(tmp / "hooks")]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    return tmp_path


def test_an_interpreter_in_a_users_directory_is_refused(tmp: Path) -> None:
    user = ensure_test_user()
    theirs = tmp / "theirs"
    theirs.mkdir()
    shutil.chown(theirs, user)
    (theirs / "python").symlink_to(sys.executable)
    res = _install(tmp, str(theirs / "python"), tmp / "mpswrap.conf")
    assert res.returncode != 0, res.stdout
    assert "can be changed by a user other than root" in res.stderr, res.stderr
    assert f"{theirs} (owned by uid" in res.stderr, res.stderr
    assert not (tmp / "hooks").exists()


def test_a_config_file_others_may_write_is_refused(tmp: Path) -> None:
    config = tmp / "mpswrap.conf"
    config.write_text("prolog_mode = opt-in\n")
    config.chmod(0o666)
    res = _install(tmp, sys.executable, config)
    assert res.returncode != 0, res.stdout
    assert f"the config file {config} can be changed" in res.stderr, res.stderr
    assert "(mode 666)" in res.stderr, res.stderr
    assert not (tmp / "hooks").exists()
    config.chmod(0o644)  # the same, safe: installed
    res = _install(tmp, sys.executable, config)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in (tmp / "hooks").iterdir()) == ["epilog", "prolog", "task_prolog"]
