"""Issue-16 gpu tier: ending 48 live clients at once on the real driver.

`mpswrap run -n 48` of the CUDA test client gets SIGTERM on its whole tree (as scancel or a
time limit does): the ladder terminates clients one by one for ``terminate_window`` seconds,
then shuts the job's server down with the rest (``shutdown_server -f``), then quits. On a
machine of several GPUs the 48 are spread over them (block), a server on each. The time
from the signal to the run's exit is printed, and the GPU must serve a new client after."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from tests.placed import placed

from .conftest import base_env, leftovers, machine_gpus

pytestmark = pytest.mark.gpu
CLIENT = os.environ.get("MPS_CONTRACT_CLIENT", "/opt/mpswrap-site/cuda_client")
N = 48
#: The issue's target for the whole teardown of 48 live clients (printed, see the end).
TARGET_S = 2.0
#: terminate_window's default.
WINDOW_S = 0.5


def _started(proc: subprocess.Popen[str], n: int, timeout: float) -> list[str]:
    """Lines of output until ``n`` clients said they started."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while sum("started" in ln for ln in lines) < n:
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines[-20:])
        lines.append(proc.stdout.readline())
    return lines


def _timeline(proc: subprocess.Popen[str], start: float, timeout: float) -> list[tuple[float, str]]:
    """Each remaining output line with its arrival, in seconds after ``start``."""
    assert proc.stdout is not None
    out: list[tuple[float, str]] = []
    deadline = time.monotonic() + timeout
    for line in iter(proc.stdout.readline, ""):
        out.append((time.monotonic() - start, line))
        assert time.monotonic() < deadline
    proc.stdout.close()
    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    out.append((time.monotonic() - start, f"(mpswrap run exited {proc.returncode})\n"))
    return out


def _firsts(timeline: list[tuple[float, str]]) -> list[tuple[float, str]]:
    """mpswrap's own lines, and the first and last line of each kind of the clients'."""
    kinds: dict[str, list[tuple[float, str]]] = {}
    for when, line in timeline:
        if not line.startswith("["):
            kinds[f"{when}{line}"] = [(when, line)]
        else:
            kinds.setdefault(re.sub(r"[0-9]+", "N", line), []).append((when, line))
    found = {item for lines in kinds.values() for item in (lines[0], lines[-1])}
    return sorted(found)


def _watch_gone(pids: list[int], start: float, gone: dict[int, float]) -> threading.Thread:
    """Record when each of ``pids`` is gone (seconds after ``start``), polling."""

    def poll() -> None:
        deadline = time.monotonic() + 120
        while len(gone) < len(pids) and time.monotonic() < deadline:
            for pid in pids:
                if pid not in gone and not psutil.pid_exists(pid):
                    gone[pid] = time.monotonic() - start
            time.sleep(0.01)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    return thread


def test_sigterm_to_a_run_of_48_clients(
    shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    archive = shared_tmp / "logs"
    env = base_env(
        {
            "MPSWRAP_USER_RUN_DIR": str(shared_tmp / "run"),
            "MPSWRAP_LOG_ARCHIVE": str(archive),
            "MPSWRAP_VERIFY_ATTACH": "off",
            "MPSWRAP_DEBUG": "1",  # the control commands, in the output
        }
    )
    argv = [sys.executable, "-m", "mpswrap", "run", "-n", str(N), "--", CLIENT, "--seconds", "300"]
    proc = subprocess.Popen(
        argv,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lines = _started(proc, N, timeout=240)
    time.sleep(2)  # every client busy in its kernel loop
    tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    clients = [int(m) for m in re.findall(r"cuda-client (\d+) started", "".join(lines))]
    gone: dict[int, float] = {}
    start = time.monotonic()
    watcher = _watch_gone(clients, start, gone)
    for pid in tree:  # like scancel: every process of the step at once
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    timeline = _timeline(proc, start, timeout=120)
    took = time.monotonic() - start
    out = "".join(lines) + "".join(line for _, line in timeline)
    print(out[-5000:])
    print("timeline after the signal (s): mpswrap's lines, first and last of the clients'")
    for when, line in _firsts(timeline):
        print(f"  {when:6.3f}  {line.rstrip()[:150]}")
    watcher.join(timeout=10)
    exits = sorted(gone.values())
    if exits:
        print(
            f"clients gone: first {exits[0]:.3f} s, median {exits[len(exits) // 2]:.3f} s, "
            f"last {exits[-1]:.3f} s ({len(exits)} of {len(clients)})"
        )
    print(f"teardown of {N} live clients after SIGTERM: {took:.2f} s (target {TARGET_S} s)")
    assert proc.returncode == 128 + signal.SIGTERM, proc.returncode
    # By server: the clients it ended by terminate_client; the servers shut down with the rest.
    pairs = set(re.findall(r"'terminate_client (\d+) (\d+)' -> '0'", out))
    terminated = Counter(server for server, _ in pairs)
    shut_down = re.findall(r"'shutdown_server (\d+) -f' ->", out)
    on_each = Counter(placed("block", N, machine_gpus()))  # clients on each GPU used
    print(f"terminate_client by server: {dict(terminated)}; shutdown_server -f: {shut_down}")
    # Every GPU's server is dealt with, once: all its clients ended by terminate_client
    # within the window, or itself shut down with those left.
    assert len(set(terminated) | set(shut_down)) == len(on_each), out[-3000:]
    assert len(set(shut_down)) == len(shut_down), shut_down
    for server, ended_there in terminated.items():
        assert server in shut_down or ended_there in on_each.values(), (server, ended_there)
    assert "teardown clean" in out, out[-3000:]
    assert leftovers(shared_tmp, mps_baseline) == []
    server_log = "".join(p.read_text() for p in archive.glob("*-server.log"))
    assert "fatal" not in server_log.lower()
    after = subprocess.run(
        [CLIENT, "--seconds", "1"],
        env={**env, "CUDA_MPS_PIPE_DIRECTORY": str(shared_tmp / "no-daemon")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert after.returncode == 0, after.stdout + after.stderr  # the GPU is healthy after
    # What mpswrap controls: the server is shut down within the window (plus command time),
    # and the run exits soon after its last client could be reaped. The clients' own exit
    # after shutdown_server -f is the driver's (1.1 to 2.3 s for 48 on an H100): the total is
    # printed against the target above, not asserted.
    # The run's ladder ends its GPUs' clients side by side, each GPU in its own window: every
    # server is shut down within it (on four H200s one GPU after another took 1.8 s, and
    # side by side but with each rank's processes read from the whole process table, 1.8 s).
    shutdowns = [t for t, line in timeline if "'shutdown_server " in line]
    print("shutdown_server -f at (s after the signal): " + ", ".join(f"{t:.2f}" for t in shutdowns))
    if shutdowns:
        assert max(shutdowns) <= WINDOW_S + 0.75, f"shutdown_server at {shutdowns} s"
    assert exits and took - exits[-1] <= 0.5, f"exit {took:.2f} s, clients gone at {exits[-1:]}"
