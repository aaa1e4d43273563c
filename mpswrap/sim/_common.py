"""What every role of the simulator shares: directories, file names, CUDA errors, wire format.

The wire format between the simulator's processes is private: one JSON object per line over
the unix socket ``<pipe>/control``. Only the fake programs speak it; mpswrap only ever sees
the command-line surface of ``nvidia-cuda-mps-control`` and the logs.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: Defaults of the real driver when the variables are unset.
PIPE_DEFAULT = "/tmp/nvidia-mps"
LOG_DEFAULT = "/var/log/nvidia-mps"

CONTROL = "control"
PRIVILEGED = "control_privileged"
LOCK = "control_lock"
PID_FILE = "nvidia-cuda-mps-control.pid"
FAULTS_VAR = "MPSWRAP_SIM_FAULTS"

#: The GPU a daemon serves when its CUDA_VISIBLE_DEVICES is unset (the contract suite's UUID).
DEFAULT_GPU = "GPU-00000000-0000-4000-8000-000000000000"
#: The most seconds an option of the simulator takes: a week, as mpswrap's.
WEEK = 7 * 24 * 3600
#: Binary version the real 580 driver reports (control.log, server.log).
BINARY_VERSION = 13000

NOT_RUNNING = "Cannot find MPS control daemon process"
BUSY = "Cannot send command to MPS control daemon process"

#: cudaGetErrorString() texts of the errors an MPS client can see.
CUDA_ERRORS = {
    2: "out of memory",
    46: "CUDA-capable device(s) is/are busy or unavailable",
    100: "no CUDA-capable device is detected",
    700: "an illegal memory access was encountered",
    805: "MPS client failed to connect to the MPS control daemon or the MPS server",
    806: "the remote procedural call between the MPS server and the MPS client failed",
    807: "MPS server is not ready to accept new MPS client requests",
    810: "the MPS client has been terminated by the server",
}


def cuda_error(code: int) -> str:
    return f"CUDA error {code}: {CUDA_ERRORS.get(code, 'unknown error')}"


def number(most: float, *, least: float = 0, whole: bool = False) -> Callable[[str], float]:
    """An option's value: a plain decimal (a whole number where ``whole``) from ``least`` to
    ``most``, not ``nan``, ``1e308``, ``1_0`` nor Arabic-Indic digits: as mpswrap's own
    options take (``mpswrap.values``, which the simulator, standing alone, does not import)."""
    # A fraction as long as a float's repr makes it (a script's 0.2 + 0.4 * 3).
    form = r"[0-9]{1,9}" if whole else r"[0-9]{1,9}(\.[0-9]{1,17})?"

    def parse(text: str) -> float:
        if not re.fullmatch(form, text) or not least <= float(text) <= most:
            import argparse

            kind = "a whole number" if whole else "a number"
            expected = f"expected {kind} from {least:g} to {most:g}"
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: {expected}")
        return int(text) if whole else float(text)

    return parse


def path(text: str) -> str:
    """A file or directory name: not empty (as mpswrap's own path options take)."""
    if not text:
        import argparse

        raise argparse.ArgumentTypeError("invalid value '': expected a path")
    return text


def pipe_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or PIPE_DEFAULT)


def log_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("CUDA_MPS_LOG_DIRECTORY") or LOG_DEFAULT)


def encode(message: Mapping[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


class LineBuffer:
    """Reassembles JSON lines from stream reads; garbage lines are dropped, not fatal."""

    def __init__(self) -> None:
        self._data = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._data += data
        out = []
        while b"\n" in self._data:
            line, self._data = self._data.split(b"\n", 1)
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                out.append(message)
        return out
