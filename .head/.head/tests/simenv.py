"""A simulated node for functional tests: MPS simulator binaries, a fake GPU inventory,
private run directories, and a check that nothing of it survives the test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

TEST_USER = "mpswtest"


@dataclass
class SimNode:
    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def control(self) -> str:
        return str(self.bin / "nvidia-cuda-mps-control")

    @property
    def client(self) -> str:
        return str(self.bin / "mps-sim-client")

    @property
    def inventory(self) -> Path:
        return self.root / "gpus.json"

    @property
    def faults(self) -> Path:
        return self.root / "faults.json"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def user_run_dir(self) -> Path:
        return self.root / "user"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MPSWRAP_", "SLURM"))}
        env.update(
            MPSWRAP_CONTROL_BINARY=self.control,
            MPSWRAP_GPU_INVENTORY=str(self.inventory),
            MPSWRAP_RUN_DIR=str(self.run_dir),
            MPSWRAP_USER_RUN_DIR=str(self.user_run_dir),
            MPSWRAP_START_TIMEOUT="10",
            MPSWRAP_TERMINATE_TIMEOUT="3",
            MPSWRAP_QUIT_TIMEOUT="2",
            MPSWRAP_COMMAND_TIMEOUT="3",
        )
        env.update(extra)
        return env

    def mpswrap(
        self, *args: str, user: str | None = None, timeout: float = 60, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "mpswrap", *args]
        env = self.env(**extra)
        if user:
            argv = [
                "runuser",
                "-u",
                user,
                "--",
                "env",
                "-i",
                *[f"{k}={v}" for k, v in env.items()],
                *argv,
            ]
        return subprocess.run(argv, env=env, text=True, capture_output=True, timeout=timeout)

    def run(
        self, *args: str, timeout: float = 60, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        """``python -m mpswrap ARGS`` as this process's user, to completion."""
        return subprocess.run([sys.executable, "-m", "mpswrap", *args], env=self.env(**extra),
                              text=True, capture_output=True, timeout=timeout)  # fmt: skip

    def start(self, *args: str, **extra: str) -> subprocess.Popen[str]:
        """``python -m mpswrap ARGS`` in its own session, like a job step: the test signals it
        as a whole."""
        return subprocess.Popen([sys.executable, "-m", "mpswrap", *args], env=self.env(**extra),
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)  # fmt: skip

    def leftovers(self) -> list[psutil.Process]:
        found = []
        marker = str(self.root)
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if proc.pid == os.getpid():
                continue
            try:
                if marker in " ".join(proc.info["cmdline"] or ()) or any(
                    marker in v for v in proc.environ().values()
                ):
                    if proc.status() != psutil.STATUS_ZOMBIE:
                        found.append(proc)
            except psutil.Error:
                continue
        return found


def make_sim_node(gpus: int = 2, **inventory: Any) -> SimNode:
    # Short and world-traversable: socket paths are limited, and a test user must get in.
    root = Path(tempfile.mkdtemp(prefix="mpsw-", dir="/tmp"))
    root.chmod(0o1777)  # like /tmp: test users create their own run dirs here
    from mpswrap.sim import install_bin
    from mpswrap.sim.inventory import write_inventory

    install_bin(root / "bin", faults=str(root / "faults.json"))
    write_inventory(root / "gpus.json", n_gpus=gpus, **inventory)
    for sub in ("bin", "gpus.json"):
        os.chmod(root / sub, 0o755)
    return SimNode(root)


def finish_sim_node(node: SimNode) -> list[str]:
    """Kill and report whatever of this node survived; remove its files."""
    deadline = time.monotonic() + 3
    left = node.leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = node.leftovers()
    report = [f"{p.pid} {' '.join(p.cmdline())}" for p in left if p.is_running()]
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    shutil.rmtree(node.root, ignore_errors=True)
    return report


@contextmanager
def sim_node(gpus: int = 2, **inventory: Any) -> Iterator[SimNode]:
    """A simulated node for one test, which fails if anything of the node survives it."""
    node = make_sim_node(gpus, **inventory)
    try:
        yield node
    finally:
        left = finish_sim_node(node)
    assert not left, f"left behind: {left}"


def ensure_test_user() -> str:
    if subprocess.run(["id", TEST_USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", TEST_USER], check=True)
    return TEST_USER
