"""A simulated node for functional tests: MPS simulator binaries, a fake GPU inventory,
private run directories, and a check that nothing of it survives the test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from mpswrap._cgroup import Cgroup, parent_dir
from mpswrap.paths import GpuDirs, JobLayout
from tests.procs import described
from tests.tree import REPO
from tests.users import run_as

#: mpswrap's command line, run by this interpreter.
MPSWRAP = [sys.executable, "-m", "mpswrap"]


@dataclass(frozen=True)
class SimFiles:
    """The simulated MPS of a node, under ``root``: its programs (``bin``), the fake GPU
    inventory mpswrap reads instead of NVML, and the fault file the programs read at every
    use (absent: no faults)."""

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

    def install(self, gpus: int, python: str | None = None) -> None:
        """Write the programs and an inventory of ``gpus`` GPUs, readable by every user. With
        ``python``: by that interpreter's mpswrap (``python -m mpswrap.sim``), which the
        programs then run; else by this process's."""
        if python is None:
            from mpswrap.sim import install_bin
            from mpswrap.sim.inventory import write_inventory

            install_bin(self.bin, faults=self.faults)
            write_inventory(self.inventory, n_gpus=gpus)
        else:
            sim = [python, "-m", "mpswrap.sim"]
            _check([*sim, "install-bin", str(self.bin), "--faults", str(self.faults)])
            _check([*sim, "inventory", str(self.inventory), "--gpus", str(gpus)])
        self.bin.chmod(0o755)
        self.inventory.chmod(0o644)


def _check(argv: list[str]) -> None:
    res = subprocess.run(argv, text=True, capture_output=True, timeout=60, check=False)
    assert res.returncode == 0, f"{' '.join(argv)} exited {res.returncode}: {res.stderr}"


@dataclass(frozen=True)
class SimNode(SimFiles):
    """A simulated node: the simulator's files, and mpswrap's run directories beside them;
    the runs ``start`` began, reaped when the node is finished (a test that fails midway
    leaves no running Popen to warn in a later test)."""

    begun: list[subprocess.Popen[str]] = field(default_factory=list, compare=False)

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def user_run_dir(self) -> Path:
        return self.root / "user"

    def layout(self, job: str, node: str = "n1", *, admin: bool | None = None) -> JobLayout:
        """The paths of ``job`` on ``node``: in run_dir (``admin``) or user_run_dir; by default
        where ``mpswrap start`` run by this process puts them (root: admin mode)."""
        admin = os.geteuid() == 0 if admin is None else admin
        return JobLayout(self.run_dir if admin else self.user_run_dir, node, job)

    def started(self, job: str, gpu: str = "g0") -> GpuDirs:
        """The directories of ``gpu`` of ``job`` that ``mpswrap start`` made, on whichever node
        name it took (this host's) and in whichever run directory (admin or user mode)."""
        found = [
            JobLayout(root, node_dir.name, job).gpu(gpu)
            for root in (self.run_dir, self.user_run_dir)
            for node_dir in (root.glob("*") if root.is_dir() else ())
            if (node_dir / job).is_dir()
        ]
        assert len(found) == 1, f"job {job} is in {len(found)} places: {found}"
        return found[0]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MPSWRAP_", "SLURM"))}
        env.update(
            MPSWRAP_CONTROL_BINARY=self.control,
            MPSWRAP_GPU_INVENTORY=str(self.inventory),
            MPSWRAP_RUN_DIR=str(self.run_dir),
            MPSWRAP_USER_RUN_DIR=str(self.user_run_dir),
            MPSWRAP_START_TIMEOUT="10",
            MPSWRAP_TERMINATE_TIMEOUT="3",
            # The simulator's control program is a Python process: one terminate_client takes
            # tens of milliseconds, seconds on a busy machine, where the real binary's takes
            # ~11 ms. So the default 0.5 s window would shut a server down with its last
            # clients (shutdown_server -f) whenever the machine is busy; tests of the window
            # set their own.
            MPSWRAP_TERMINATE_WINDOW="30",
            # A farm profile of the node's own: farms of other tests never teach this one.
            MPSWRAP_FARM_PROFILE=str(self.root / "farm-profile.json"),
            MPSWRAP_QUIT_TIMEOUT="2",
            MPSWRAP_COMMAND_TIMEOUT="3",
            # The mpswrap under test, whatever the working directory (the node's own: what a
            # command writes relative to it stays in the node, apart from parallel tests).
            PYTHONPATH=str(REPO),
        )
        env.update(extra)
        return env

    def mpswrap(
        self, *args: str, user: str | None = None, timeout: float = 60, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        """``python -m mpswrap ARGS`` to completion, as ``user`` (with exactly this node's
        environment) or as this process's user."""
        argv, env = [*MPSWRAP, *args], self.env(**extra)
        if user:
            return run_as(user, argv, env, cwd=self.root, timeout=timeout)
        return subprocess.run(
            argv, env=env, cwd=self.root, text=True, capture_output=True, timeout=timeout
        )

    def run(
        self, *args: str, timeout: float = 60, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        """``python -m mpswrap ARGS`` as this process's user, to completion."""
        return self.mpswrap(*args, timeout=timeout, **extra)

    def start(self, *args: str, **extra: str) -> subprocess.Popen[str]:
        """``python -m mpswrap ARGS`` in its own session, like a job step: the test signals it
        as a whole."""
        proc = subprocess.Popen(
            [*MPSWRAP, *args],
            env=self.env(**extra),
            cwd=self.root,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.begun.append(proc)
        return proc

    def run_unread(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``python -m mpswrap ARGS`` with a standard output nobody reads (``| head -1`` after
        the reader left): every write fails with EPIPE."""
        read, write = os.pipe()
        os.close(read)
        try:
            return self.run_writing_to(write, *args)
        finally:
            os.close(write)

    def run_writing_to(self, stdout: IO[str] | int, *args: str) -> subprocess.CompletedProcess[str]:
        """``python -m mpswrap ARGS`` with ``stdout`` (a file or descriptor: ``/dev/full``, a
        pipe nobody reads) as its standard output, its standard error captured."""
        return subprocess.run(
            [*MPSWRAP, *args],
            env=self.env(),
            cwd=self.root,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )

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

    def wait_nothing_left(self, timeout: float) -> list[psutil.Process]:
        """What of the node still runs after waiting up to ``timeout`` seconds for it to end:
        a watchdog or a guard ends the daemons in the background, after a test's last look."""
        deadline = time.monotonic() + timeout
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left


def make_sim_node(gpus: int = 2) -> SimNode:
    # Short and world-traversable: socket paths are limited, and a test user must get in.
    root = Path(tempfile.mkdtemp(prefix="mpsw-", dir="/tmp"))
    root.chmod(0o1777)  # like /tmp: test users create their own run dirs here
    node = SimNode(root)
    node.install(gpus)
    return node


def finish_sim_node(node: SimNode) -> list[str]:
    """Kill and report whatever of this node survived (its processes, root's cgroups of its
    jobs); remove its files."""
    for run in node.begun:  # still running only where the test failed before its end
        if run.poll() is None:
            run.kill()
        run.communicate(timeout=30)
    left = node.wait_nothing_left(3)
    report = [what for p in left if (what := described(p)) is not None]
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    report += [f"cgroup {cg.path}" for cg in _cgroups_of(node)]
    for cgroup in _cgroups_of(node):
        cgroup.kill()
        cgroup.wait_empty(5)
        cgroup.remove()
    shutil.rmtree(node.root, ignore_errors=True)
    return report


def _cgroups_of(node: SimNode) -> list[Cgroup]:
    """Root's cgroups of this node's jobs (named after run_dir's checksum, state.job_cgroup)."""
    parent = parent_dir("auto")
    if parent is None or not parent.is_dir():
        return []
    tag = f"{zlib.crc32(os.fsencode(str(node.run_dir))):08x}"
    return [Cgroup(path) for path in sorted(parent.glob(f"*.{tag}"))]


@contextmanager
def sim_node(gpus: int = 2) -> Iterator[SimNode]:
    """A simulated node for one test, which fails if anything of the node survives it."""
    node = make_sim_node(gpus)
    try:
        yield node
    finally:
        left = finish_sim_node(node)
    assert not left, f"left behind: {left}"
