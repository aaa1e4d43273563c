"""Where a ``session()`` rank is attached: what ``with mpswrap.session() as s`` returns."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import _wait
from ..config import Settings
from ..errors import ControlError, MpswrapError
from ..mps.control import Control, find_binary
from ..mps.cuda import mps_client

__all__ = ["Session"]


@dataclass
class Session:
    """Where this rank is attached; returned by ``with mpswrap.session() as s``."""

    gpu_uuid: str
    local_rank: int
    local_size: int
    pipe_dir: Path
    log_dir: Path
    active_thread_percentage: float | None
    mode: str  # "prolog" (admin daemons) or "user" (started for this job by mpswrap)
    env: dict[str, str]
    settings: Settings = field(repr=False)

    def check_attached(self, timeout: float = 10.0, pid: int | None = None) -> int:
        """After the first CUDA call: wait until the daemon lists ``pid`` (default: this
        process) as a client; return its server's PID, or raise with what to check.

        For this process the driver is asked too (``CU_DEVICE_ATTRIBUTE_MPS_ENABLED``): a
        context it says runs without MPS fails at once; one it says runs through MPS while the
        daemon lists no such PID within 2 s (another PID namespace) returns 0."""
        own = pid is None or pid == os.getpid()
        pid = os.getpid() if pid is None else pid
        driver = mps_client() if own else None
        if driver is False:
            raise self._not_attached(pid, "the CUDA driver says this context does not use MPS")
        control, last = self._control(), ""
        for _ in _wait.backoff(min(timeout, 2.0) if driver else timeout, first=0.01, cap=0.2):
            try:
                server = control.has_client({pid})
                if server is not None:
                    return server
            except ControlError as exc:
                last = f"; {exc.line()}"
        if driver:
            return 0  # attached, says the driver; the daemon sees this process by another PID
        raise self._not_attached(pid, f"not in the daemon's client list after {timeout:g} s{last}")

    def _not_attached(self, pid: int, cause: str) -> MpswrapError:
        return MpswrapError(
            "not an MPS client",
            thing=f"pid {pid}, pipe {self.pipe_dir}",
            cause=cause,
            hint="call check_attached() after the first CUDA call; CUDA must start after "
            "session() (else it runs without MPS, silently), and this user must reach the "
            "pipe directory",
            context="session",
        )

    def is_client(self, pid: int | None = None) -> bool:
        """Whether the daemon lists ``pid`` (default: this process) as a client right now."""
        try:
            self.check_attached(timeout=0.0, pid=pid)
        except MpswrapError:
            return False
        return True

    def _control(self) -> Control:
        binary = find_binary(self.settings.control_binary)
        return Control(binary, self.pipe_dir, self.log_dir, self.settings.command_timeout)
