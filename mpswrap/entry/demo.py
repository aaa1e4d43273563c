"""``mpswrap demo``: the whole life cycle in one command, on the real GPU or simulated.

Starts one MPS daemon per GPU, attaches clients, shows ``status``, stops everything through
the teardown ladder (terminate_client first) and checks that nothing is left. Without a GPU
(or with ``--simulate yes``) it uses mpswrap's built-in MPS simulator and a fake inventory.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import _proc, _wait
from .._signals import Interrupted, hold, raising
from ..config import Settings, load_settings
from ..errors import MpswrapError, UsageError
from ..job import state
from ..job.job import JobDaemons
from ..job.placement import plan_positions
from ..mps.control import client_env, find_binary
from ..mps.gpu import Inventory, client_limit, load_inventory
from ..mps.start import Defaults
from ..report.status import print_status

__all__ = ["cli"]

log = logging.getLogger(__name__)

TORCH_CLIENT = (
    "import torch, time\n"
    "x = torch.randn(512, 512, device='cuda')\n"
    "end = time.time() + {seconds}\n"
    "while time.time() < end:\n"
    "    x = torch.tanh(x @ x); torch.cuda.synchronize()\n"
)


def _real_available(settings: Settings) -> bool:
    """The control program and GPUs the settings name (the admin file's paths included)."""
    try:
        find_binary(settings.control_binary)
        return bool(load_inventory(settings.gpu_inventory).gpus)
    except MpswrapError:
        return False


def _settings(tmp: Path, simulate: bool, config_file: str | None) -> Settings:
    """The node's settings (``--config``, ``MPSWRAP_*``: a bad value is exit 2, as for every
    command), the demo's own directory in place of user_run_dir, and the simulator's
    programs and GPUs where it simulates."""
    overrides: dict[str, Any] = {"user_run_dir": str(tmp / "run")}
    if simulate:
        from ..sim import install_bin
        from ..sim.inventory import write_inventory

        install_bin(tmp / "bin")
        write_inventory(tmp / "gpus.json", n_gpus=2)
        overrides.update(
            control_binary=str(tmp / "bin" / "nvidia-cuda-mps-control"),
            gpu_inventory=str(tmp / "gpus.json"),
        )
    return load_settings(overrides, config_file=config_file)


def _client_argv(tmp: Path, simulate: bool, seconds: float) -> list[str] | None:
    if simulate:
        return [str(tmp / "bin" / "mps-sim-client"), "--seconds", str(seconds)]
    if importlib.util.find_spec("torch") is None:
        return None
    return [sys.executable, "-c", TORCH_CLIENT.format(seconds=seconds)]


def _wait_for_clients(daemons: JobDaemons, count: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = daemons.status()
        found = sum(len(s["clients"]) for g in status["gpus"] for s in g.get("servers", []))
        if found >= count or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def _start_clients(daemons: JobDaemons, argv: list[str] | None, n: int, procs: list[Any]) -> None:
    """Each client started joins ``procs`` at once: a demo cut short ends those started."""
    if argv is None:
        print("2. PyTorch is not installed: no clients to attach")
        return
    print(f"2. attaching {n} clients, block placement over the GPUs")
    slots = daemons.slots(None)
    for position in plan_positions(n, len(slots)):
        env = dict(os.environ, **client_env(slots[position].dirs, slots[position].uuid))
        procs.append(
            _proc.spawn(
                argv, env=env, new_session=False, stdout=_proc.DEVNULL, stderr=_proc.DEVNULL
            )
        )


def run_demo(n_clients: int, simulate: bool, config_file: str | None = None) -> int:
    """The demo; interrupted (TERM, INT, HUP, its reader gone) or failed at any step, it
    still ends its clients and daemons and removes its directory before it exits."""
    try:
        with raising():
            return _demo(n_clients, simulate, config_file)
    except Interrupted as exc:  # as a run or a farm says it (its output may be gone: a log)
        log.warning("demo: interrupted by %s: its clients and daemons were ended", exc)
        raise


def _demo(n_clients: int, simulate: bool, config_file: str | None) -> int:
    base = tempfile.gettempdir()  # $TMPDIR where the daemons' socket paths fit in it
    tmp = Path(tempfile.mkdtemp(prefix="mpswrap-demo-", dir=base if len(base) <= 32 else "/tmp"))
    procs: list[Any] = []
    pending: JobDaemons | None = None  # started, not yet stopped
    try:
        settings = _settings(tmp, simulate, config_file)
        kind = "simulated MPS (no GPU needed)"
        if not simulate:  # the admin file may name a list of GPUs in NVML's place
            nvml = settings.gpu_inventory == "nvml"
            kind = "the real GPU" if nvml else f"the GPUs listed in {settings.gpu_inventory}"
        inventory = load_inventory(settings.gpu_inventory)
        _check_clients(n_clients, inventory, settings)
        gpus = inventory.gpus
        daemons = JobDaemons(state.user_layout(settings, "demo", f"demo-{os.getpid()}"), settings)
        pending = daemons
        print(f"1. starting one MPS daemon per GPU on {kind}: {len(gpus)} GPU(s)")
        daemons.start(
            gpus,
            _proc.lookup_user(),
            started_by="cli",
            shared_parents=False,
            defaults=Defaults.from_settings(settings),
        )
        _start_clients(daemons, _client_argv(tmp, simulate, seconds=120), n_clients, procs)
        print("3. mpswrap status")
        print_status(_wait_for_clients(daemons, len(procs), timeout=90))
        print("4. stopping: terminate_client for every client, then quit, then checks")
        done, pending = daemons.stop(), None
        for line in done.lines():
            print(f"   {line}")
        for proc in procs:
            _wait.wait_child(proc, 30)  # one still running is named by the check below
        left = _proc.procs_mentioning(str(tmp))
        clean = done.clean and not left and not daemons.layout.job_dir.exists()
        print("5. nothing left behind" if clean else f"5. LEFT BEHIND: {left}")
        return 0 if clean else 1
    finally:
        hold()  # a signal now would cut the cleanup short: it runs to its end
        if pending is not None:  # cut short: the same ladder, quietly
            _stop_quietly(pending)
        _wait.end_procs([], signal.SIGKILL, children=procs)
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_quietly(daemons: JobDaemons) -> None:
    """The teardown of a demo cut short; what it leaves is logged (its output may be gone)."""
    try:
        left = daemons.stop().problems()
    except MpswrapError as exc:
        left = [exc.line()]
    for item in left:
        log.warning("demo: left behind: %s", item)


def _check_clients(n_clients: int, inventory: Inventory, settings: Settings) -> None:
    """Refuse, before anything starts, more clients than the GPUs' MPS servers take (the
    demo places them in blocks over every GPU): never attach fewer than were asked for."""
    limits = [
        client_limit(g, inventory.cuda_driver_version, os.environ, settings.client_limit)
        for g in inventory.gpus
    ]
    if n_clients > sum(limits):
        each = f"{limits[0]} a GPU" if len(set(limits)) == 1 else "client_limit"
        raise UsageError(
            "bad --clients",
            thing=str(n_clients),
            cause=f"{len(limits)} GPU(s) take at most {sum(limits)} MPS clients ({each})",
            hint=f"mpswrap demo --clients {sum(limits)}",
        )


def cli(args: argparse.Namespace) -> int:
    settings = load_settings(config_file=args.config)  # a bad one refused before anything
    # auto: the simulator where the settings name one (an inventory file) or find no GPU
    simulate = args.simulate == "yes" or (
        args.simulate == "auto"
        and (settings.gpu_inventory != "nvml" or not _real_available(settings))
    )
    return run_demo(args.clients, simulate, args.config)
