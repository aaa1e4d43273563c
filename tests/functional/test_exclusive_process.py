"""``exclusive_process`` (simulator only): the prolog's EXCLUSIVE_PROCESS on a job's whole
GPUs, and the rule that the mode found goes back only when no other job uses the GPU.

The hooks' full path under Slurm is in tests/integration/test_slurm_hooks.py; here the two
steps run on their own against the simulator's inventory file, with another job's daemon
directory on the same GPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from mpswrap.config import Settings, load_settings
from mpswrap.job import state
from mpswrap.job.exclusive import get_mode, make_exclusive, restore_modes
from mpswrap.jobenv import JobEnv
from mpswrap.mps.gpu import load_inventory
from mpswrap.mps.rootrecord import Held, write_held
from mpswrap.sim.inventory import write_inventory
from mpswrap.slurm.scontrol import NodeShare

pytestmark = pytest.mark.functional

WHOLE = NodeShare((0,), {}, "gpu:1(IDX:0)")


@pytest.fixture
def setup(tmp_path: Path) -> tuple[JobEnv, Settings, str, Path]:
    inventory = write_inventory(tmp_path / "inventory.json", 2)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    settings = load_settings(
        env={"MPSWRAP_RUN_DIR": str(run_dir), "MPSWRAP_GPU_INVENTORY": str(inventory)},
        config_file=None,
    )
    env = JobEnv({"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "7"})
    uuid = load_inventory(str(inventory)).gpus[0].uuid
    return env, settings, uuid, inventory


def _other_job_on(settings: Settings, uuid: str, job: str = "8") -> None:
    """Another job's daemon on the GPU: root's record of it is what the epilog looks for."""
    layout = state.admin_layout(settings, "n1", job)
    state.create(layout, 0, 0, shared_parents=True)
    layout.gpu("g0").root.mkdir(parents=True)
    side = state.root_side(settings, layout, "g0")
    with side.lock:
        write_held(side.record, Held("g0", uuid, 1000, 1000, "someone", "prolog"))


def test_whole_gpus_become_exclusive_and_the_last_job_restores_them(setup: Any) -> None:
    env, settings, uuid, inventory = setup
    gpu = load_inventory(str(inventory)).by_uuid(uuid)
    make_exclusive(env, settings, WHOLE, [gpu])
    assert get_mode(uuid, str(inventory)) == "EXCLUSIVE_PROCESS"
    kept = Path(settings.run_dir) / f"compute-mode.n1.{uuid}"
    assert kept.read_text().split() == ["DEFAULT", "7"]
    # Another job has a daemon on the GPU: this job's epilog leaves the mode.
    _other_job_on(settings, uuid)
    assert restore_modes(env, settings, "7") == 0
    assert get_mode(uuid, str(inventory)) == "EXCLUSIVE_PROCESS" and kept.exists()
    # Once that job is gone, the next epilog on the node (any job's) puts DEFAULT back.
    shutil.rmtree(state.admin_layout(settings, "n1", "8").job_dir)
    state.root_side(settings, state.admin_layout(settings, "n1", "8"), "g0").record.unlink()
    assert restore_modes(env, settings, "9") == 0
    assert get_mode(uuid, str(inventory)) == "DEFAULT" and not kept.exists()


def test_shared_gpus_and_unknown_allocations_keep_their_mode(setup: Any) -> None:
    env, settings, uuid, inventory = setup
    gpu = load_inventory(str(inventory)).by_uuid(uuid)
    for share in (
        NodeShare((0,), {0: 50.0}, "mps:50(50/100,0/100)"),
        NodeShare((0,), {}, "gpu:1(IDX:0),shard:2(IDX:0)"),
        None,
    ):
        make_exclusive(env, settings, share, [gpu])
        assert get_mode(uuid, str(inventory)) == "DEFAULT", share
    assert not list(Path(settings.run_dir).glob("compute-mode.*"))


def test_a_mode_found_other_than_default_is_what_comes_back(setup: Any) -> None:
    env, settings, uuid, inventory = setup
    data = json.loads(inventory.read_text())
    data["gpus"][0]["compute_mode"] = "PROHIBITED"
    inventory.write_text(json.dumps(data))
    gpu = load_inventory(str(inventory)).by_uuid(uuid)
    make_exclusive(env, settings, WHOLE, [gpu])
    assert get_mode(uuid, str(inventory)) == "EXCLUSIVE_PROCESS"
    assert restore_modes(env, settings, "7") == 0
    assert get_mode(uuid, str(inventory)) == "PROHIBITED"


def test_a_job_whose_prolog_set_the_mode_holds_it_before_it_has_daemons(setup: Any) -> None:
    """Job 8's prolog made the GPU exclusive and has no daemon yet when job 7's epilog runs:
    the kept file names job 8, so job 7's epilog leaves the mode; job 8's puts it back."""
    env, settings, uuid, inventory = setup
    gpu = load_inventory(str(inventory)).by_uuid(uuid)
    other = JobEnv({"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "8"})
    make_exclusive(env, settings, WHOLE, [gpu])
    make_exclusive(other, settings, WHOLE, [gpu])
    kept = Path(settings.run_dir) / f"compute-mode.n1.{uuid}"
    assert kept.read_text().split() == ["DEFAULT", "7", "8"]
    assert restore_modes(env, settings, "7") == 0
    assert get_mode(uuid, str(inventory)) == "EXCLUSIVE_PROCESS"
    assert kept.read_text().split() == ["DEFAULT", "8"]
    assert restore_modes(other, settings, "8") == 0
    assert get_mode(uuid, str(inventory)) == "DEFAULT" and not kept.exists()
