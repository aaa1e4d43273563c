"""tools/install-and-demo.sh ends by saying how to put mpswrap on PATH (README, Set up), and
exits with the demo's status. The venv is a fake one: its python takes pip's commands and
does nothing, its mpswrap prints what the real one would and exits as told."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.tree import REPO

pytestmark = [pytest.mark.functional]

SCRIPT = REPO / "tools" / "install-and-demo.sh"


def _fake_venv(root: Path, demo_status: int) -> Path:
    bin_dir = root / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "mpswrap").write_text(
        '#!/bin/sh\nif [ "$1" = --version ]; then echo "mpswrap 0.1.0"; exit 0; fi\n'
        f'echo "$*"; exit {demo_status}\n'
    )
    for name in ("python", "mpswrap"):
        (bin_dir / name).chmod(0o755)
    return bin_dir.parent


@pytest.mark.parametrize("demo_status", [0, 3])
def test_it_ends_by_saying_how_to_put_mpswrap_on_path(tmp_path: Path, demo_status: int) -> None:
    venv = _fake_venv(tmp_path, demo_status)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "VENV": str(venv)}
    res = subprocess.run(
        ["bash", str(SCRIPT), "--clients", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == demo_status, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert "demo --clients 2" in lines, res.stdout
    links = "/usr/local" if os.geteuid() == 0 else f"{tmp_path}/.local"
    comp = "share/bash-completion/completions"
    assert lines[lines.index("demo --clients 2") + 1 :] == [
        "",
        f"mpswrap is installed in {venv}/bin, which is not on PATH. To run it as 'mpswrap':",
        f"  ln -s {venv}/bin/mpswrap {links}/bin/mpswrap     # once, for every shell",
        f'  export PATH="{venv}/bin:$PATH"              # or: this shell only',
        f"Its man page and bash completion are in {venv}/share: man finds the page while "
        f"{venv}/bin",
        "is on PATH, bash-completion 2.12+ finds the completion either way; else link them:",
        f"  mkdir -p {links}/share/man/man1 {links}/{comp}",
        f"  ln -s {venv}/share/man/man1/mpswrap.1 {links}/share/man/man1/",
        f"  ln -s {venv}/{comp}/mpswrap.bash {links}/{comp}/",
        "On a Slurm cluster, users get it with 'module load mpswrap' (slurm/README.md, Install).",
    ], res.stdout
