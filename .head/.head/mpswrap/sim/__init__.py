"""A simulator of NVIDIA MPS for machines without a GPU: CI and ``mpswrap demo``.

It reproduces what mpswrap can see of the real driver (seen on an H100, driver 580): the
``nvidia-cuda-mps-control`` command surface and replies, the daemon's pid file and sockets in
the pipe directory, control.log and server.log lines, one server process per user, clients
that attach through the pipe directory (or silently run without MPS when they cannot reach
it), terminate_client, the blocking quit, shutdown_server, the 48-client limit, fatal faults.
By default it is no kinder than the driver: one command at a time ("Cannot send command"),
terminate_client answering before the client has exited, quit answering before its servers
exit, servers without arguments, nothing ending itself when its pipe directory goes. The
table "The simulator against the real driver" in docs/concepts.md lists each behaviour and
the contract test that pins it.

    install_bin(dir)       wrapper scripts nvidia-cuda-mps-control and mps-sim-client
    inventory.write_inventory(path)   a fake NVML inventory

Standard library only: the wrappers run it with a bare environment, as another user.
Faults and timings come from the JSON file named by ``MPSWRAP_SIM_FAULTS`` (see _faults).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

__all__ = ["install_bin"]

#: The directory that holds the ``mpswrap`` package: the wrappers put it on PYTHONPATH.
_ROOT = Path(__file__).resolve().parent.parent.parent

_WRAPPERS = {
    "nvidia-cuda-mps-control": "mpswrap.sim.control",
    "mps-sim-client": "mpswrap.sim.client",
}


def _script(module: str, python: str, faults: Path | None) -> str:
    lines = [
        "#!/bin/sh",
        "# Written by mpswrap.sim.install_bin: the simulated MPS.",
        f"PYTHONPATH={shlex.quote(str(_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}",
        "export PYTHONPATH",
    ]
    if faults is not None:
        lines.append(f"MPSWRAP_SIM_FAULTS={shlex.quote(str(faults))}")
        lines.append("export MPSWRAP_SIM_FAULTS")
    lines.append(f'exec {shlex.quote(python)} -m {module} "$@"')
    return "\n".join(lines) + "\n"


def install_bin(
    bin_dir: str | os.PathLike[str],
    *,
    python: str = sys.executable,
    faults: str | os.PathLike[str] | None = None,
) -> Path:
    """Write the wrappers into bin_dir (created if needed); return bin_dir."""
    out = Path(bin_dir)
    out.mkdir(parents=True, exist_ok=True)
    python = os.path.abspath(python)
    fault_path = Path(faults).absolute() if faults is not None else None
    for name, module in _WRAPPERS.items():
        path = out / name
        path.write_text(_script(module, python, fault_path))
        path.chmod(0o755)
    return out
