"""The boot's copy of NVML's inventory (mps/inventory_cache): root's prolog uses it while the
kernel's account of the GPUs is unchanged, never when anyone but root could have written it,
and never for a view of other GPUs than the kernel's. NVML is a stand-in that counts its calls;
/proc is a fake tree. (Run as root, as CI does: the cache is root's.)"""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path
from typing import Any

import pytest

from mpswrap.config import load_settings
from mpswrap.job import state
from mpswrap.mps import gpu, inventory_cache
from mpswrap.mps.gpu import GpuInfo, Inventory
from tests.tree import PACKAGE
from tests.users import ensure_test_user, run_as

GPUS = [
    GpuInfo(
        0,
        "GPU-00000000-0000-0000-0000-000000000001",
        1,
        "H100",
        (9, 0),
        frozenset({0, 1, 2}),
        0,
        False,
        80 << 30,
        "0000:00:06.0",
    ),
    GpuInfo(
        1,
        "GPU-00000000-0000-0000-0000-000000000002",
        0,
        "H100",
        (9, 0),
        frozenset({3}),
        None,
        False,
        80 << 30,
        "0000:00:07.0",
    ),
]
INFO = (
    "Model: \t NVIDIA H100\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"
)


class FakeNvml:
    def __init__(self) -> None:
        self.asked = 0

    def __call__(self) -> Inventory:
        self.asked += 1
        return Inventory(list(GPUS), "580.159.04", 13000, source="nvml", _nvml=self)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[object]:
        class Proc:
            pid = 4242

        return [Proc()]


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, FakeNvml]:
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("1b7c747a-e0f4-4a85-b13f-df82c80ddd63\n")
    (proc / "driver/nvidia").mkdir(parents=True)
    (proc / "driver/nvidia/version").write_text("NVRM version: 580.159.04\nGCC version: 15\n")
    for g in GPUS:
        (proc / "driver/nvidia/gpus" / g.pci_bus_id).mkdir(parents=True)
        text = INFO.format(uuid=g.uuid, bus=g.pci_bus_id, minor=g.minor)
        (proc / "driver/nvidia/gpus" / g.pci_bus_id / "information").write_text(text)
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    fake = FakeNvml()
    monkeypatch.setattr(inventory_cache, "PROC", proc)
    monkeypatch.setattr(gpu, "_from_nvml", fake)
    monkeypatch.setattr(gpu, "init_nvml", lambda: fake)
    monkeypatch.setattr(gpu, "_CACHE", {})
    return run, fake


def _forge(run: Path, change: Any) -> Path:
    """The kept file of node n1, with ``change`` applied to its JSON."""
    kept = run / "inventory.n1.json"
    data = json.loads(kept.read_text())
    change(data)
    kept.write_text(json.dumps(data))
    return kept


def _load(run: Path, **settings: str) -> Inventory:
    gpu._CACHE.clear()  # a new process
    return state.node_inventory(load_settings({"run_dir": str(run), **settings}), "n1")


def test_nvml_is_asked_once_per_boot_and_the_copy_is_what_it_said(
    node: tuple[Path, FakeNvml],
) -> None:
    run, fake = node
    first = _load(run)
    kept = run / "inventory.n1.json"
    assert fake.asked == 1 and kept.exists()
    assert oct(kept.stat().st_mode & 0o777) == "0o644" and kept.stat().st_uid == 0
    again = _load(run)
    assert fake.asked == 1, "the second process asked NVML although the copy was current"
    assert again.gpus == first.gpus == GPUS
    assert (again.driver_version, again.cuda_driver_version) == ("580.159.04", 13000)
    assert again.compute_pids(GPUS[0].uuid) == [4242], "NVML is opened for process queries"


@pytest.mark.parametrize(
    "change",
    [
        "sys/kernel/random/boot_id",
        "driver/nvidia/version",
        "driver/nvidia/gpus/0000:00:07.0/information",
    ],
)
def test_a_new_boot_driver_or_gpu_means_nvml_again(
    node: tuple[Path, FakeNvml], change: str
) -> None:
    run, fake = node
    _load(run)
    path = inventory_cache.PROC / change
    path.write_text(path.read_text().replace("0", "9", 1))
    _load(run)
    assert fake.asked == 2
    _load(run)
    assert fake.asked == 2, "the copy was not written again for the new account"


def test_a_gpu_added_or_removed_means_nvml_again(node: tuple[Path, FakeNvml]) -> None:
    run, fake = node
    _load(run)
    (inventory_cache.PROC / "driver/nvidia/gpus/0000:00:07.0/information").unlink()
    (inventory_cache.PROC / "driver/nvidia/gpus/0000:00:07.0").rmdir()
    _load(run)
    assert fake.asked == 2


def test_without_the_proc_files_there_is_no_copy(node: tuple[Path, FakeNvml]) -> None:
    run, fake = node
    (inventory_cache.PROC / "driver/nvidia/version").unlink()  # e.g. a container
    _load(run)
    _load(run)
    assert fake.asked == 2 and not (run / "inventory.n1.json").exists()


def test_off_means_nvml_every_time(node: tuple[Path, FakeNvml]) -> None:
    run, fake = node
    _load(run, inventory_cache="no")
    _load(run, inventory_cache="no")
    assert fake.asked == 2 and not (run / "inventory.n1.json").exists()


def test_a_copy_that_is_not_json_or_not_an_inventory_is_replaced(
    node: tuple[Path, FakeNvml],
) -> None:
    run, fake = node
    _load(run)
    kept = run / "inventory.n1.json"
    now = json.loads(kept.read_text())["fingerprint"]
    for text in ["{not json", json.dumps({"fingerprint": now, "gpus": [{"index": "x"}]})]:
        kept.write_text(text)
        assert _load(run).gpus == GPUS
    assert fake.asked == 3
    assert json.loads(kept.read_text())["gpus"][0]["uuid"] == GPUS[0].uuid


def test_a_directory_others_can_write_is_neither_read_nor_written(
    node: tuple[Path, FakeNvml],
) -> None:
    run, fake = node
    _load(run)
    kept = _forge(run, lambda data: data["gpus"][0].update(cpus=[99]))
    for mode in (0o777, 0o1777):  # a user could have put it there, sticky or not
        run.chmod(mode)
        assert _load(run).gpus == GPUS
    assert fake.asked == 3
    assert json.loads(kept.read_text())["gpus"][0]["cpus"] == [99], "written into an open dir"


def test_only_root_writes_the_copy(
    node: tuple[Path, FakeNvml], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, fake = node
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    _load(run)
    assert fake.asked == 1 and not (run / "inventory.n1.json").exists()


def test_a_link_in_place_of_the_copy_is_not_followed(
    node: tuple[Path, FakeNvml], tmp_path: Path
) -> None:
    run, fake = node
    _load(run)
    real = tmp_path / "elsewhere.json"
    os.replace(run / "inventory.n1.json", real)
    (run / "inventory.n1.json").symlink_to(real)
    _load(run)
    assert fake.asked == 2 and not (run / "inventory.n1.json").is_symlink()


def test_run_dir_of_another_owner_is_neither_read_nor_written(node: tuple[Path, FakeNvml]) -> None:
    run, fake = node
    _load(run)
    os.chown(run, 65534, 65534)  # nobody's, mode 0755: nobody could have written the file
    assert _load(run).gpus == GPUS
    assert fake.asked == 2
    os.chown(run, 0, 0)


def test_a_file_of_another_owner_is_not_read(node: tuple[Path, FakeNvml]) -> None:
    run, fake = node
    _load(run)
    os.chown(run / "inventory.n1.json", 65534, 65534)
    _load(run)
    assert fake.asked == 2


def test_no_run_dir_yet_means_nvml_and_no_file(node: tuple[Path, FakeNvml]) -> None:
    run, fake = node
    run.rmdir()
    _load(run)
    assert fake.asked == 1 and not run.exists()


def test_an_nvml_view_of_other_gpus_is_not_kept(
    node: tuple[Path, FakeNvml], monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML asked inside a cgroup that hides a GPU must not become the node's inventory."""
    run, _ = node
    narrowed = Inventory([GPUS[1]], "580.159.04", 13000, source="nvml")
    monkeypatch.setattr(gpu, "_from_nvml", lambda: narrowed)
    assert _load(run).gpus == [GPUS[1]]
    assert not (run / "inventory.n1.json").exists()


def test_a_kept_file_that_disagrees_with_the_kernel_is_not_used(
    node: tuple[Path, FakeNvml],
) -> None:
    run, fake = node
    _load(run)
    _forge(run, lambda data: data["gpus"].pop())  # the fingerprint still names both GPUs
    assert _load(run).gpus == GPUS
    assert fake.asked == 2


def test_only_the_prolog_uses_the_file() -> None:
    """A rank, a task prolog or a command asks NVML for its own view (a job's cgroup may hide
    GPUs and renumber the rest): only entry/hooks.py (the prolog's start) asks for the file."""
    users = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if "node_inventory(" in p.read_text() and p.name != "state.py"
    )
    assert users == ["entry/hooks.py"]


def test_a_file_another_user_writes_into_their_run_dir_is_not_read(
    node: tuple[Path, FakeNvml],
) -> None:
    """A real second user owns run_dir (an admin's mistake) and writes a current-looking
    inventory there with other CPUs: root's prolog asks NVML instead, and writes nothing."""
    run, fake = node
    _load(run)
    forged = json.loads((run / "inventory.n1.json").read_text())
    forged["gpus"][0]["cpus"] = [99]
    (run / "inventory.n1.json").unlink()
    user = ensure_test_user()
    os.chown(run, pwd.getpwnam(user).pw_uid, -1)
    for level in (run.parent, *run.parent.parents):  # the user reaches run_dir
        if level == Path("/tmp"):
            break
        level.chmod(level.stat().st_mode | 0o005)
    target = str(run / "inventory.n1.json")
    res = run_as(user, ["sh", "-c", 'cat > "$1"', "sh", target], input=json.dumps(forged))
    assert res.returncode == 0, res.stderr
    assert _load(run).gpus == GPUS
    assert fake.asked == 2
    assert json.loads((run / "inventory.n1.json").read_text())["gpus"][0]["cpus"] == [99]
