"""The MPS contract: one suite, two backends.

``MPS_CONTRACT_BACKEND=sim`` (default, CI) runs it against mpswrap's simulator;
``MPS_CONTRACT_BACKEND=real`` against the real ``nvidia-cuda-mps-control`` on a GPU machine, with
``MPS_CONTRACT_CLIENT`` naming a real CUDA client built from tests/gpu/cuda_client.cu.
The same assertions hold for both, so the simulator cannot drift from the driver.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from mpswrap.mps.control import Control


@dataclass
class Backend:
    name: str
    control_binary: str
    client_binary: str
    gpu: str
    root: Path
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    #: Pipe directories of further daemons a test started (two daemons on one GPU).
    pipes: list[Path] = field(default_factory=list)

    @property
    def pipe(self) -> Path:
        return self.root / "pipe"

    @property
    def log(self) -> Path:
        return self.root / "log"

    def env(
        self, pipe: Path | None = None, log: Path | None = None, **extra: str
    ) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            CUDA_MPS_PIPE_DIRECTORY=str(pipe or self.pipe),
            CUDA_MPS_LOG_DIRECTORY=str(log or self.log),
            CUDA_VISIBLE_DEVICES=self.gpu,
        )
        env.update(extra)
        return env

    def control(
        self, timeout: float = 10.0, pipe: Path | None = None, log: Path | None = None
    ) -> Control:
        return Control(self.control_binary, pipe or self.pipe, log or self.log, timeout=timeout)

    def start_daemon(
        self, pipe: Path | None = None, log: Path | None = None, cpus: list[int] | None = None
    ) -> None:
        """``nvidia-cuda-mps-control -d`` (under ``taskset -c`` with cpus), then wait for it."""
        pipe, log = pipe or self.pipe, log or self.log
        for path in (pipe, log):
            path.mkdir(exist_ok=True)
        if pipe != self.pipe:
            self.pipes.append(pipe)
        pin = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
        argv = [*pin, self.control_binary, "-d"]
        subprocess.run(argv, env=self.env(pipe, log), check=True, timeout=30)
        deadline = time.monotonic() + 15
        while not self.control(pipe=pipe, log=log).ping():
            assert time.monotonic() < deadline, "daemon did not answer"
            time.sleep(0.02)

    def client(
        self,
        *args: str,
        pipe: Path | None = None,
        log: Path | None = None,
        group: int | None = None,
        **extra: str,
    ) -> subprocess.Popen[str]:
        """A client; with ``group``, in that process group (0: a new one it leads), which a
        test signals as a whole: every member has the signal before any of them runs on."""
        joins = None if group is None else functools.partial(os.setpgid, 0, group)
        proc = subprocess.Popen(
            [self.client_binary, *args],
            env=self.env(pipe, log, **extra),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # A setpgid call alone between fork and exec (process_group= needs Python 3.11).
            preexec_fn=joins,  # noqa: PLW1509
        )
        self.procs.append(proc)
        return proc

    def started(self, proc: subprocess.Popen[str]) -> None:
        """Wait until the client is past CUDA initialisation (it printed its start line)."""
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "started" in line, line

    def wait_clients(
        self, server: int, count: int, timeout: float = 60.0, pipe: Path | None = None
    ) -> list[int]:
        deadline = time.monotonic() + timeout
        while True:
            clients = self.control(pipe=pipe).client_list(server)
            if len(clients) >= count or time.monotonic() > deadline:
                return clients
            time.sleep(0.05)

    def server(self, timeout: float = 60.0, pipe: Path | None = None) -> int:
        deadline = time.monotonic() + timeout
        while True:
            servers = self.control(pipe=pipe).server_list()
            if servers:
                return servers[0]
            assert time.monotonic() < deadline, "no server started"
            time.sleep(0.05)

    def recovered(self) -> bool:
        """The server is ACTIVE again (or gone, to be restarted by the next client)."""
        servers = self.control().server_list()
        return not servers or self.control().server_status(servers[0]) == "ACTIVE"

    def server_log(self) -> str:
        path = self.log / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _sim_backend(root: Path) -> Backend:
    bindir = root / "bin"
    from mpswrap.sim import install_bin

    install_bin(bindir)
    return Backend(
        "sim",
        str(bindir / "nvidia-cuda-mps-control"),
        str(bindir / "mps-sim-client"),
        "GPU-00000000-0000-4000-8000-000000000000",
        root,
    )


def _real_backend(root: Path) -> Backend:
    binary = shutil.which(
        "nvidia-cuda-mps-control", path="/usr/local/nvidia/bin:" + os.environ.get("PATH", "")
    )
    client = os.environ.get("MPS_CONTRACT_CLIENT")
    if not binary or not client:
        pytest.skip("real backend needs nvidia-cuda-mps-control and MPS_CONTRACT_CLIENT")
    uuid = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
        check=True,
        text=True,
        capture_output=True,
    ).stdout.split()[0]
    return Backend("real", binary, client, uuid, root)


@pytest.fixture
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    # Short root: unix socket paths are limited to 107 bytes.
    root = Path(tmp_path_factory.mktemp("mps", numbered=True))
    kind = os.environ.get("MPS_CONTRACT_BACKEND", "sim")
    b = _real_backend(root) if kind == "real" else _sim_backend(root)
    for sub in (b.pipe, b.log):
        sub.mkdir()
    try:
        yield b
    finally:
        _teardown(b)


def _teardown(b: Backend) -> None:
    """End clients, quit the daemon, and make sure nothing of this backend survives."""
    for proc in b.procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    for pipe in (b.pipe, *b.pipes):
        try:
            subprocess.run(
                [b.control_binary],
                input="quit\n",
                text=True,
                env=b.env(pipe),
                timeout=20,
                capture_output=True,
            )
        except subprocess.TimeoutExpired:
            pass
    # quit answers before the daemon process has finished exiting (the real daemon, too, is
    # reaped only later; a server that had a fatal fault took over 10 s on four H200s): give
    # what quit ended a bounded moment, then anything alive leaked.
    deadline = time.monotonic() + 30
    while (left := _processes_of(b)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for stray in left:
        stray.kill()
    assert not left, f"left behind: {[p.pid for p in left]}"


def _processes_of(b: Backend) -> list[psutil.Process]:
    """Processes other than this one whose command line or environment names this test's
    directory (every pipe directory of the test lies in it)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if (
                proc.pid != os.getpid()
                and proc.status() != psutil.STATUS_ZOMBIE
                and (
                    str(b.root) in " ".join(proc.info["cmdline"] or ())
                    or any(str(b.root) in v for v in proc.environ().values())
                )
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def pytest_report_header() -> str:
    kind = os.environ.get("MPS_CONTRACT_BACKEND", "sim")
    return f"mps contract backend: {kind} ({sys.executable})"
