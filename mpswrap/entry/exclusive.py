"""The admin option ``exclusive_process``: a job's whole GPUs in compute mode
EXCLUSIVE_PROCESS while it runs, so that only its MPS server holds a context on them.

The prolog sets the mode on GPUs the job holds whole (gres/gpu, no gres/mps or shard share:
other jobs' processes may share those) and keeps the mode it found in
``<run_dir>/compute-mode.<node>.<GPU UUID>`` (root's, like run_dir). An epilog puts that mode
back, and removes the file, only when no other job on the node has a daemon for the GPU: the
last one to leave restores it, also after a prolog that failed once it had set the mode. A
GPU already EXCLUSIVE_PROCESS is left alone. Tested on the simulator only: the GPU machine's
compute mode is never changed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from ..config import Settings
from ..errors import MpswrapError
from ..job import state
from ..job.job import JobDaemons
from ..jobenv import JobEnv
from ..mps.computemode import EXCLUSIVE, MODES, get_mode, set_mode
from ..mps.gpu import GpuInfo
from ..paths import list_dir, read_job_file, validate_name, write_job_file
from .slurmjob import NodeShare

__all__ = ["make_exclusive", "restore_modes"]

log = logging.getLogger(__name__)


def _found_file(settings: Settings, node: str, uuid: str) -> Path:
    name = f"compute-mode.{validate_name('node name', node)}.{validate_name('GPU UUID', uuid)}"
    return Path(settings.run_dir) / name


def make_exclusive(
    env: JobEnv, settings: Settings, share: NodeShare | None, gpus: Sequence[GpuInfo]
) -> None:
    """Before the daemons start: EXCLUSIVE_PROCESS on each GPU the job holds whole."""
    if share is None or not share.whole_gpus:
        log.info("compute mode left as it is: the job's GPUs are shared or Slurm did not say")
        return
    for gpu in gpus:
        found = get_mode(gpu.uuid, settings.gpu_inventory)
        if found == EXCLUSIVE:
            continue
        kept = _found_file(settings, env.node, gpu.uuid)
        if read_job_file(kept, 64) is None:  # another job's prolog may have kept it already
            write_job_file(kept, found + "\n", 0, 0)
        set_mode(gpu.uuid, EXCLUSIVE, settings.gpu_inventory)
        log.info("GPU %s: compute mode %s (was %s)", gpu.uuid, EXCLUSIVE, found)


def restore_modes(env: JobEnv, settings: Settings, job: str) -> int:
    """After teardown: the mode found back on each GPU of this node that a prolog made
    EXCLUSIVE_PROCESS and no other job's daemon uses (this job's, or one whose prolog failed
    after setting it); how many GPUs could not be restored."""
    failed = 0
    prefix = f"compute-mode.{validate_name('node name', env.node)}."
    names = list_dir(Path(settings.run_dir), "cannot read run_dir") or []
    for uuid in sorted(n[len(prefix) :] for n in names if n.startswith(prefix)):
        try:
            kept = _found_file(settings, env.node, uuid)
            text = read_job_file(kept, 64)
            if text is None:
                continue
            if _used_elsewhere(settings, env.node, job, uuid):
                log.info("GPU %s: left %s, another job uses it", uuid, EXCLUSIVE)
                continue
            mode = text.strip() if text.strip() in MODES else "DEFAULT"
            set_mode(uuid, mode, settings.gpu_inventory)
            kept.unlink()
            log.info("GPU %s: compute mode %s again", uuid, mode)
        except (MpswrapError, OSError) as exc:
            log.error("GPU %s: compute mode not restored: %s", uuid, exc)
            failed += 1
    return failed


def _used_elsewhere(settings: Settings, node: str, job: str, uuid: str) -> bool:
    for layout in state.jobs_on_node(settings, node, None):
        if layout.job_id == job:
            continue
        try:
            manifests = JobDaemons(layout, settings).manifests()
        except MpswrapError:
            return True  # unreadable: count it as in use, never take the GPU from it
        if any(m.gpu_uuid.lower() == uuid.lower() for m in manifests):
            return True
    return False
