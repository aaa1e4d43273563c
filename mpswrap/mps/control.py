"""The one module that speaks the ``nvidia-cuda-mps-control`` protocol (v2).

Each command is one bounded run of the control program with the daemon's pipe directory in
its environment and the command on stdin; replies are parsed into Python values.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from .. import _proc, _wait, fields, trust
from .._struct import Struct
from ..errors import ConfigError, ControlError, MpswrapError, ProcError
from ..jobenv import JobEnv
from ..paths import GpuDirs, read_job_file

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any

__all__ = ["Control", "client_env", "client_status", "daemon_env", "find_binary", "read_pid"]

#: The control daemon's pid file holds one number.
PID_LIMIT = 64

log = logging.getLogger(__name__)
_NUMBER = re.compile(r"[0-9]{1,3}(\.[0-9]+)?")

#: Where NVIDIA's packages put the MPS binaries; hooks run with a minimal PATH.
SEARCH_PATH = (
    "/usr/local/nvidia/bin",
    "/usr/local/cuda/bin",
    "/usr/bin",
    "/usr/local/bin",
    "/usr/sbin",
    "/bin",
)
NOT_RUNNING = ("Cannot find MPS control daemon process",)
BUSY = "Cannot send command to MPS control daemon process"
#: The real daemon answers a bad command on stdout and exits 0 (seen on driver 580):
#: ``Unknown command "x"``, ``Server 1 not found``.
REFUSALS = ("Unknown command", "not found")
#: Why a command was not sent: the deadline it draws from (a teardown's, a status run's) passed.
DEADLINE_PASSED = "the deadline has passed"
#: Seconds to keep retrying a command the daemon is too busy to take.
BUSY_RETRY = 2.0
#: Bytes of a reply kept: the control program relays what a socket in the job user's pipe
#: directory sends, which may be anything (a real reply is a few KiB at most).
REPLY_LIMIT = 1 << 20
#: PIDs of one reply at most (servers of a daemon, clients of a server).
PIDS_LIMIT = 4096


def find_binary(name: str) -> str:
    """Absolute path of the control program: a path as given, else PATH and NVIDIA's dirs.
    Root runs it only where no other user can change it or a directory above it (``trust``):
    else a TrustError names the level."""
    found = locate_binary(name)
    if trust.is_root():
        trust.check_root_file(found, "MPS control program")
    return found


def locate_binary(name: str) -> str:
    """The control program's absolute path, trusted or not (``find_binary`` checks it). A
    path that is no executable file is a bad value of ``control_binary`` (ConfigError, exit
    2, as for ``gpu_inventory``); a name found nowhere, a program this node lacks (exit 1)."""
    if os.path.isabs(name):
        if os.access(name, os.X_OK) and os.path.isfile(name):
            return name
        raise ConfigError(
            "MPS control program not found",
            thing=name,
            cause="not an executable file",
            hint="set control_binary to the nvidia-cuda-mps-control path",
        )
    search = os.pathsep.join([os.environ.get("PATH", ""), *SEARCH_PATH])
    found = shutil.which(name, path=search)
    if found is None:
        raise ProcError(
            "MPS control program not found",
            thing=name,
            cause="not on PATH nor in /usr/local/nvidia/bin, /usr/bin",
            hint="install the NVIDIA driver utilities or set control_binary",
        )
    return found


def daemon_env(pipe: Path, log_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every control call and the daemon itself gets (never the caller's)."""
    env = {
        "PATH": _proc.SAFE_PATH,
        "LANG": "C",
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(log_dir),
    }
    env.update(extra or {})
    return env


def client_env(
    dirs: GpuDirs,
    uuid: str,
    *,
    threads: float | None = None,
    mem_limit: str | None = None,
    priority: int | None = None,
) -> dict[str, str]:
    """The variables that attach one client to its GPU's daemon.

    ``CUDA_VISIBLE_DEVICES=<UUID>``: attached, the client sees that GPU; should it ever run
    without MPS it still stays on its own GPU instead of landing on device 0 with the rest.
    """
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(dirs.log),
        "CUDA_VISIBLE_DEVICES": uuid,
    }
    if threads is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = f"{threads:g}"
    if mem_limit:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mem_limit}"
    if priority is not None:
        env["CUDA_MPS_CLIENT_PRIORITY"] = str(priority)
    return env


class Snapshot(Struct, frozen=True):
    """The daemon as ``status`` shows it: its default active thread percentage, and per
    server its status (ACTIVE, FAULT), active thread percentage and clients."""

    default_active_thread_percentage: float
    servers: dict[int, tuple[str, float, list[int]]]
    #: Servers listed but passed over (not the daemon's own).
    passed_over: int = 0


class Control(Struct, frozen=True):
    """Commands to one control daemon, identified by its pipe directory."""

    binary: str
    pipe: Path
    log_dir: Path
    timeout: float = 10.0
    user: _proc.UserIds | None = None
    #: Every command's time is drawn from it (the epilog's one deadline).
    deadline: _wait.Deadline = _wait.NO_DEADLINE
    #: The pipe directory as messages and logs name it: the job's, where ``pipe`` is root's
    #: pinned folder, whose name no one else may learn (``rootrecord.pin_control``).
    shown: Path | None = None

    @property
    def named(self) -> str:
        return str(self.shown or self.pipe)

    def command(self, line: str, timeout: float | None = None) -> str:
        """Send one command; return its stdout stripped, or raise ControlError.

        "Cannot send command" is retried with backoff for a short while: several ranks' ladders
        may talk to one daemon at once (scancel signals every rank together).
        """
        for elapsed in _wait.backoff(self.deadline.bound(BUSY_RETRY), first=0.01, cap=0.2):
            try:
                return self._once(line, timeout)
            except ControlError as exc:
                retry = self.deadline.bound(BUSY_RETRY)
                if BUSY not in str(exc.fields.get("stderr", "")) or elapsed >= retry:
                    raise
                log.debug("control %s busy, retrying %r", self.named, line)
        raise AssertionError("unreachable")  # pragma: no cover - backoff always ends in raise

    def _once(self, line: str, timeout: float | None) -> str:
        argv = [self.binary]
        env = daemon_env(self.pipe, self.log_dir)
        bound = self.deadline.bound(timeout or self.timeout)
        try:
            if bound <= 0:
                raise ProcError("not sent", cause=DEADLINE_PASSED)
            res = _proc.run(
                argv, env=env, input=line + "\n", timeout=bound, user=self.user, limit=REPLY_LIMIT
            )
        except ProcError as exc:
            raise ControlError(
                f"MPS control command {line.split(maxsplit=1)[0]!r} failed",
                thing=self.named,
                cause=exc.line(),
                command=line,
                stderr=exc.stderr,
            ) from exc
        err, out = res.stderr.strip(), res.stdout.strip()
        said = f"{err}\n{out}".strip()
        refused = any(out.startswith(m) or f" {m}" in out for m in REFUSALS)
        if res.returncode != 0 or refused or any(m in said for m in (*NOT_RUNNING, BUSY)):
            raise ControlError(
                f"MPS control command {line.split(maxsplit=1)[0]!r} failed",
                thing=self.named,
                cause=(said.splitlines() or [f"exit {res.returncode}"])[0],
                command=line,
                returncode=res.returncode,
                stderr=said,
            )
        log.debug("control %s: %r -> %r", self.named, line, res.stdout.strip())
        return res.stdout.strip()

    def _pids(self, line: str) -> list[int]:
        """A reply of process IDs (ASCII digits in range, at most ``PIDS_LIMIT``)."""
        words = self.command(line).split(maxsplit=PIDS_LIMIT)
        try:
            if len(words) > PIDS_LIMIT:
                raise fields.FieldError(f"more than {PIDS_LIMIT} process IDs")
            return [fields.pid_text(word) for word in words]
        except fields.FieldError as exc:
            raise ControlError("unexpected reply", thing=line, cause=str(exc)) from None

    def _float(self, line: str) -> float:
        """A reply of one percentage (its last word)."""
        out = self.command(line)
        try:
            value = float(out.split()[-1][:32])
            return fields.number(value, 100.0)
        except (ValueError, IndexError):
            raise ControlError("unexpected reply", thing=line, cause=repr(out[:200])) from None

    def ping(self) -> bool:
        """True if a daemon answers in this pipe directory."""
        try:
            self.command("get_server_list")
        except ControlError:
            return False
        return True

    def server_list(self) -> list[int]:
        return self._pids("get_server_list")

    def server_status(self, server: int) -> str:
        words = self.command(f"get_server_status {server}").split()
        if not words:
            raise ControlError("unexpected reply", thing=f"get_server_status {server}")
        return words[-1]

    def client_list(self, server: int) -> list[int]:
        return self._pids(f"get_client_list {server}")

    def clients(self) -> dict[int, list[int]]:
        """Every server and its clients: the one walk over servers and clients."""
        return {server: self.client_list(server) for server in self.server_list()}

    def snapshot(
        self, servers_limit: int = 64, keep: Callable[[int], bool] | None = None
    ) -> Snapshot:
        """What ``status`` shows of the daemon, in one control run for the daemon and one per
        server (of those ``keep`` keeps, where given): the commands of each go on one stdin,
        their one-line replies first (the control program answers them in order, as the
        contract suite checks). ``Snapshot.passed_over``: the servers ``keep`` refused."""
        words = self.command("get_server_list\nget_default_active_thread_percentage").split()
        try:
            default = fields.number(float(words[-1][:32]), 100.0)
            pids = [fields.pid_text(w) for w in words[:-1][:servers_limit]]
        except (ValueError, IndexError):
            cause = repr(words[:8])
            raise ControlError("unexpected reply", thing="get_server_list", cause=cause) from None
        kept = [p for p in pids if keep is None or keep(p)]
        servers = {}
        for server in kept:
            batch = f"get_server_status {server}\nget_active_thread_percentage {server}\n"
            lines = self.command(batch + f"get_client_list {server}").splitlines()
            try:
                status, share = lines[0].split()[-1], float(lines[1].split()[-1][:32])
                clients = [fields.pid_text(w) for w in " ".join(lines[2:]).split()[:PIDS_LIMIT]]
                servers[server] = (status[:32], fields.number(share, 100.0), clients)
            except (ValueError, IndexError):
                cause = repr(lines[:4])
                raise ControlError("unexpected reply", thing=batch, cause=cause) from None
        return Snapshot(default, servers, len(pids) - len(kept))

    def has_client(self, pids: set[int]) -> int | None:
        """The server one of ``pids`` is a client of, or None."""
        return next((s for s, c in self.clients().items() if pids & set(c)), None)

    def terminate_client(self, server: int, client: int) -> None:
        out = self.command(f"terminate_client {server} {client}")
        if out.split()[-1:] != ["0"]:
            raise ControlError(
                "terminate_client refused", thing=f"client {client}", cause=repr(out[:200])
            )

    def shutdown_server(self, server: int, force: bool = False) -> None:
        """``shutdown_server <pid> [-f]``: with ``-f`` the server ends now and its clients
        fail at their next CUDA call (SIGPIPE or 806 on an H100)."""
        self.command(f"shutdown_server {server}" + (" -f" if force else ""))

    def set_default_active_thread_percentage(self, percent: float) -> float:
        return self._float(f"set_default_active_thread_percentage {percent:g}")

    def default_active_thread_percentage(self) -> float:
        return self._float("get_default_active_thread_percentage")

    def active_thread_percentage(self, server: int) -> float:
        return self._float(f"get_active_thread_percentage {server}")

    def set_default_pinned_mem_limit(self, device: str, value: str) -> None:
        self.command(f"set_default_device_pinned_mem_limit {device} {value}")

    def set_default_client_priority(self, priority: int) -> None:
        self.command(f"set_default_client_priority {priority}")

    def start_server(self, uid: int) -> None:
        self.command(f"start_server -uid {uid}", timeout=max(self.timeout, 30.0))

    def quit(self, force_after: float | None = None) -> None:
        """``quit`` (or ``quit -t N``): only call it once every client is gone.

        With clients alive a plain quit blocks and locks the daemon against every other
        command; ``-t`` bounds that on drivers that have it.
        """
        if force_after is None:
            self.command("quit")
            return
        seconds = max(1, int(force_after))
        self.command(f"quit -t {seconds}", timeout=seconds + self.timeout)


#: The fields of one client in ``status --json`` (``jobs[].gpus[].servers[].clients[]``).
CLIENT_FIELDS = {
    "pid": "the client's process ID",
    "cmdline": "its command line",
    "user": "the user it runs as",
    "start_time": "when it started, seconds since the epoch",
    "uptime_s": "seconds since it started",
    "rank": "its rank from the launcher's variables (MPSWRAP_RANK, SLURM_PROCID, ...) or null",
    "task": "the number of the farm task it belongs to (MPSWRAP_TASK), or null",
    "active_thread_percentage": "its CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, or null (the server's)",
    "pinned_mem_limit": "its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, or null",
    "gpu_memory_bytes": "GPU memory it uses, from NVML (MPS-aware query where the driver has "
    "it), or null where NVML cannot say",
}


def _whole(read: Callable[[], int | None]) -> int | None:
    """A number from a client's environment; None where its variable is malformed (that
    client's rank or task is unknown, no more)."""
    try:
        return read()
    except MpswrapError:
        return None


def client_status(pid: int, uid: int | None) -> dict[str, Any] | None:
    """One client as ``status`` shows it; its rank, farm task, thread share and memory limit
    from its environment, read only when it runs as ``uid`` (the daemon's user: the PIDs come
    from a daemon that user controls) and we may read it: words for people and labels for
    metrics, never a reason to act. GPU memory comes from NVML later. None for a process of
    another user than ``uid``: the daemon's listing of it is not shown (its command line
    would reach the job's status and metrics)."""
    facts = _proc.facts(pid, uid)
    owner = facts.pop("uid")
    if uid is not None and owner is not None and owner != uid:
        return None
    env, start = facts.pop("environ"), facts["start_time"]
    share = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    return {
        "pid": pid,
        **facts,
        "uptime_s": round(time.time() - start, 1) if start else None,
        "rank": _whole(lambda: JobEnv(env).rank),
        "task": _whole(lambda: JobEnv(env).farm_task),
        "active_thread_percentage": float(share) if share and _NUMBER.fullmatch(share) else None,
        "pinned_mem_limit": env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
        "gpu_memory_bytes": None,
    }


def read_pid(path: Path) -> int | None:
    """The control daemon's PID from its pid file; None where it holds no process ID."""
    try:
        return fields.pid_text((read_job_file(path, PID_LIMIT) or "").strip())
    except fields.FieldError:
        return None
