"""Where a ``session()`` rank is attached: what ``with mpswrap.session() as s`` returns."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import _wait
from ..config import Settings
from ..errors import ControlError, MpswrapError
from ..mps.control import Control, find_binary

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
        process) as a client; return its server's PID, or raise with what to check."""
        pid = os.getpid() if pid is None else pid
        control, last = self._control(), ""
        for _ in _wait.backoff(timeout, first=0.01, cap=0.2):
            try:
                server = control.has_client({pid})
                if server is not None:
                    return server
            except ControlError as exc:
                last = f"; {exc.line()}"
        raise MpswrapError(
            "not an MPS client",
            thing=f"pid {pid}, pipe {self.pipe_dir}",
            cause=f"not in the daemon's client list after {timeout:g} s{last}",
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
