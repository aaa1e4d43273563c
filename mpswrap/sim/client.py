"""The simulated CUDA program: ``mps-sim-client [--seconds S] [--fault-after S] [--linger S]
[--alloc-mib M] [--busy N] [--record FILE] [--tag T]``, the same command line as
tests/gpu/cuda_client.cu.

It attaches to the MPS daemon of ``CUDA_MPS_PIPE_DIRECTORY`` as a real client does when CUDA
initialises, and keeps that connection for its whole life so the daemon sees when it exits.
No daemon reachable (missing, stale, no permission): it runs without MPS, silently. It
"works" for S seconds, then exits 0; a message from the daemon makes its next CUDA call fail:
terminate 810, fatal fault 700, forced quit 806, each with exit status 1 after ``--linger``
seconds (default: the fault file's ``client_linger``); a server shut down with
``shutdown_server -f`` kills it with SIGPIPE, as the real client dies writing to it. With
``--alloc-mib M`` it holds M MiB of its GPU's memory from its start to its exit; where the
GPU has no room left (``memory``) it fails at once with CUDA error 2, "out of memory". With
``--busy N`` (the real client's N x N matrix products back to back) it is a busy client until
its work ends: killed before that without ``terminate_client``, it faults its server
(``_pool``).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any

from . import _faults, memory
from ._common import (
    CONTROL,
    DEFAULT_GPU,
    FAULTS_VAR,
    WEEK,
    LineBuffer,
    cuda_error,
    encode,
    number,
    pipe_dir,
)

#: Daemon message -> (CUDA error, reason recorded).
EVENTS = {"terminate": (810, "terminated"), "fault": (700, "fault"), "forced": (806, "forced")}
#: select() wakes at once on a daemon message, as a real client's next CUDA call fails at
#: once; this only bounds the idle wake-ups of 48 clients sharing a small CI machine.
STEP = 0.5


class Client:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.pid = os.getpid()
        self.sock: socket.socket | None = None
        self.buffer = LineBuffer()

    def record(self, event: str, **fields: Any) -> None:
        if not self.args.record:
            return
        line = json.dumps({"event": event, "pid": self.pid, **fields}) + "\n"
        # One O_APPEND write per line: many clients can share one file.
        fd = os.open(self.args.record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def idle(self) -> None:
        """Its kernels are over (done, or a CUDA call failed): tell the daemon, which then
        knows its exit is no death mid-kernel."""
        if self.sock is not None and self.args.busy:
            try:
                self.sock.sendall(encode({"event": "idle"}))
            except OSError:
                pass  # the daemon is gone: nobody to tell

    def fail(self, code: int, reason: str) -> int:
        self.idle()
        # Recorded when the CUDA call returns the error, before the program reports it: with
        # its supervisor gone, stderr may be a pipe nobody reads and the report kill it.
        self.record("end", reason=reason, time=time.time())
        print(cuda_error(code), file=sys.stderr, flush=True)
        linger = self.args.linger
        if linger is None:
            linger = _faults.load(os.environ.get(FAULTS_VAR)).client_linger
        time.sleep(linger)  # host work before the program notices and exits
        return 1

    def killed(self) -> int:
        """Its server was shut down by force: the next call writes to a closed socket."""
        self.record("end", reason="killed", time=time.time())
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)
        return 1  # pragma: no cover - the signal ends the process

    # --- attach ---------------------------------------------------------------------------
    def attach(self) -> dict[str, Any] | None:
        """The daemon's answer, or None to run without MPS (nobody answered)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        hello = {
            "role": "client",
            "pid": self.pid,
            "uid": os.getuid(),
            "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "busy": self.args.busy > 0,
        }
        try:
            sock.connect(str(pipe_dir() / CONTROL))
            sock.sendall(encode(hello))
            while True:  # a client of another user may wait here while users are serialised
                data = sock.recv(65536)
                messages = self.buffer.feed(data)
                if messages or not data:
                    break
        except OSError:
            sock.close()
            return None
        if not messages:
            sock.close()
            return None
        self.sock = sock
        return messages[0]

    # --- work -----------------------------------------------------------------------------
    def messages(self, timeout: float) -> list[dict[str, Any]]:
        """Wait up to timeout for daemon messages; a closed connection detaches silently."""
        if self.sock is None:
            time.sleep(timeout)
            return []
        readable, _, _ = select.select([self.sock], [], [], timeout)
        if not readable:
            return []
        try:
            data = self.sock.recv(65536)
        except OSError:
            data = b""
        if not data:  # daemon gone (crash): the server, orphaned, still runs the work
            self.sock.close()
            self.sock = None
        return self.buffer.feed(data)

    def work(self) -> int:
        start = time.monotonic()
        end = start + self.args.seconds
        fault = None if self.args.fault_after is None else start + self.args.fault_after
        while True:
            now = time.monotonic()
            if fault is not None and now >= fault and now < end:
                return self.fault()
            if now >= end:
                break
            until = min(end, fault) if fault is not None else end
            for message in self.messages(min(STEP, until - now)):
                if message.get("event") == "killed":
                    return self.killed()
                if message.get("event") in EVENTS:
                    return self.fail(*EVENTS[str(message["event"])])
        self.idle()
        print(f"mps-sim-client {self.pid} done", flush=True)
        self.record("end", reason="done", time=time.time())
        return 0

    def fault(self) -> int:
        """An illegal address: tell the server (which tells every client), then fail."""
        if self.sock is not None:
            try:
                self.sock.sendall(encode({"event": "fault"}))
            except OSError:
                pass
        return self.fail(700, "fault")

    def run(self) -> int:
        answer = self.attach()
        if answer is not None and "error" in answer:
            code = int(answer["error"])
            return self.fail(code, f"error{code}")
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES") or DEFAULT_GPU
        if not memory.allocate(os.environ, gpu, int(self.args.alloc_mib * (1 << 20))):
            return self.fail(2, "oom")
        try:
            return self.started(answer)
        finally:
            memory.release(os.environ, gpu)

    def started(self, answer: dict[str, Any] | None) -> int:
        server = int(answer["server"]) if answer else None
        mode = "mps" if answer else "non-mps"
        # Records and output name the PID the server lists it by: in a PID namespace of its
        # own (a container) that is not os.getpid(), which is kept as ``ns_pid``.
        ns_pid, self.pid = self.pid, int((answer or {}).get("pid") or self.pid)
        print(
            f"mps-sim-client {self.pid} mode={mode}"
            + (f" server={server}" if server else "")
            + " started",
            flush=True,
        )
        self.record(
            "start",
            uid=os.getuid(),
            mode=mode,
            server_pid=server,
            pipe=str(pipe_dir()),
            cvd=os.environ.get("CUDA_VISIBLE_DEVICES"),
            tag=self.args.tag,
            ns_pid=ns_pid,
            time=time.time(),
        )
        return self.work()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mps-sim-client", description=__doc__)
    seconds = number(WEEK)
    parser.add_argument("--seconds", type=seconds, default=2.0)
    parser.add_argument("--fault-after", type=seconds, default=None)
    parser.add_argument("--linger", type=seconds, default=None)
    # Device memory held for its whole life (``memory``: the simulated GPU's ledger).
    parser.add_argument("--alloc-mib", type=number(2**30), default=0.0)
    # N x N matrix products back to back on the real client; here only "busy" (``_pool``).
    parser.add_argument("--busy", type=number(99999, whole=True), default=0)
    parser.add_argument("--record", default=None)
    parser.add_argument("--tag", default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    # Behave like a C program: SIGINT, when not inherited as ignored, kills by the signal
    # (Python would raise KeyboardInterrupt). SIGTERM/SIGHUP keep their inherited action.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    return Client(parse(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
