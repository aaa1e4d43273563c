"""The simulated ``nvidia-cuda-mps-control``: daemon (``-d``, ``-f``) and command client.

    nvidia-cuda-mps-control -d        start the daemon in the background (exits 0 at once)
    nvidia-cuda-mps-control -f        run the daemon in the foreground
    echo CMD | nvidia-cuda-mps-control   or   nvidia-cuda-mps-control CMD ARGS...

Reads ``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``, ``CUDA_VISIBLE_DEVICES`` and
the simulator's ``MPSWRAP_SIM_FAULTS``, which the daemon remembers from its own start.

Unlike the real daemon, the simulated one also exits by itself within about a second once its
pipe directory is deleted: a safety net so that a test that forgets it cannot leak it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from . import _faults
from ._common import (
    CONTROL,
    DEFAULT_GPU,
    FAULTS_VAR,
    LOCK,
    NOT_RUNNING,
    PID_FILE,
    encode,
    log_dir,
    pipe_dir,
)
from ._daemon import Daemon
from ._log import MpsLog

ALREADY_RUNNING = "An instance of this daemon is already running"


# --- command client ----------------------------------------------------------------------
def _ask(pipe: Path, line: str) -> dict[str, object] | None:
    """Send one command; None when no daemon answers (or it died before answering)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(pipe / CONTROL))
        sock.sendall(encode({"role": "ui", "cmd": line}))
        data = b""
        # No timeout: like the real client, this blocks for as long as the daemon does
        # (a quit waiting for clients, a hung daemon); callers bound it themselves.
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        return None
    finally:
        sock.close()
    try:
        reply = json.loads(data)
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None


def _command(pipe: Path, line: str) -> int:
    reply = _ask(pipe, line)
    if reply is None:
        print(NOT_RUNNING, file=sys.stderr)
        return 1
    out, err, rc = str(reply.get("stdout", "")), str(reply.get("stderr", "")), reply.get("rc", 1)
    if out:
        print(out, flush=True)
    if err:
        print(err, file=sys.stderr, flush=True)
    return rc if isinstance(rc, int) else 1


def command_client(words: list[str]) -> int:
    pipe = pipe_dir()
    lines = [" ".join(words)] if words else (raw.strip() for raw in sys.stdin)
    for line in lines:
        if line:
            rc = _command(pipe, line)
            if rc:
                return rc
    return 0


# --- daemon ------------------------------------------------------------------------------
def _take_lock(pipe: Path) -> int | None:
    """Hold ``control_lock`` for the daemon's whole life; None if a live daemon holds it.

    An flock dies with its holder, so a crashed daemon's stale files never block a new one.
    """
    fd = os.open(pipe / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.fchmod(fd, 0o666)
    return fd


def _daemonize() -> bool:
    """Double fork; True in the original process, which then exits 0 without waiting."""
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child:
        os.waitpid(child, 0)  # the middle process exits at once; reap it
        return True
    os.setsid()
    if os.fork():
        os._exit(0)
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    return False


def _write_pid(pipe: Path) -> None:
    fd = os.open(pipe / PID_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        os.fchmod(fd, 0o666)
        os.write(fd, str(os.getpid()).encode())  # no newline, as the 580 driver writes it
    finally:
        os.close(fd)


def _prepare(pipe: Path, logs: Path) -> int | None:
    """Directories and the lock, in the foreground so errors reach the caller's stderr."""
    try:
        pipe.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        lock = _take_lock(pipe)
    except OSError as exc:
        print(f"nvidia-cuda-mps-control: cannot use {pipe}: {exc.strerror}", file=sys.stderr)
        return None
    if lock is None:
        print(ALREADY_RUNNING, file=sys.stderr)
    return lock


def _gpu() -> str:
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return first if first.upper().startswith("GPU-") else DEFAULT_GPU


def start(foreground: bool) -> int:
    faults_path = os.environ.get(FAULTS_VAR) or None
    faults = _faults.load(faults_path)
    if faults.start == "fail":
        print(
            "nvidia-cuda-mps-control: failed to start (simulated by MPSWRAP_SIM_FAULTS)",
            file=sys.stderr,
        )
        return 1
    pipe, logs = pipe_dir(), log_dir()
    if _prepare(pipe, logs) is None:
        return 1
    if not foreground and _daemonize():
        return 0
    _write_pid(pipe)
    MpsLog(logs).touch()
    if faults.start == "die":
        os._exit(1)  # crashed during start-up: a stale pid file, no socket
    time.sleep(faults.slow_seconds())
    daemon = Daemon(pipe, logs, _gpu(), faults_path)
    daemon.listen()
    return daemon.run()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0].startswith("-"):
        if args in (["-d"], ["-f"]):
            return start(foreground=args == ["-f"])
        print(
            f"nvidia-cuda-mps-control: unrecognized option {' '.join(args)!r}\n"
            "usage: nvidia-cuda-mps-control [-d | -f]",
            file=sys.stderr,
        )
        return 1
    return command_client(args)


if __name__ == "__main__":
    sys.exit(main())
