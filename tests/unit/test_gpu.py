"""GPU lists: NVML indices, UUIDs, and Slurm gres positions through device minor numbers.

Slurm numbers GPUs by their position in gres.conf; NVML by its own index. The two orders
differ on real nodes, so positions must go through gres.conf ``File=`` to the device's minor
number. /dev/null (minor 3), /dev/zero (5) and /dev/full (7) stand in for GPU devices here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mpswrap.errors import GpuError
from mpswrap.mps.gpu import GpuInfo, Inventory, resolve_gpus
from mpswrap.slurm.gpus import resolve_gres_positions

#: NVML index order: minors 7, 3, 5 (neither sorted nor the gres.conf order below).
INVENTORY = Inventory(
    [
        GpuInfo(
            i, f"GPU-0000000{i}-0000-4000-8000-000000000000", minor, "H100", (9, 0), frozenset()
        )
        for i, minor in enumerate((7, 3, 5))
    ],
    source="test",
)


def _gres(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gres.conf"
    path.write_text(text)
    return path


def test_gres_positions_go_through_device_minors_not_nvml_order(tmp_path: Path) -> None:
    conf = _gres(
        tmp_path,
        "AutoDetect=off\n"
        "NodeName=other Name=gpu File=/dev/full\n"
        "NodeName=n[1-2] Name=gpu File=/dev/null\n"  # position 0: minor 3 = NVML index 1
        "NodeName=n1 Name=gpu File=/dev/zero  # position 1: minor 5 = NVML index 2\n"
        "NodeName=n1 Name=mps Count=100 File=/dev/full\n",
    )
    found = resolve_gres_positions([1, 0], INVENTORY, conf, "n1")
    assert [g.index for g in found] == [2, 1]


def test_without_gres_files_positions_follow_minor_order(tmp_path: Path) -> None:
    conf = _gres(tmp_path, "AutoDetect=nvml\n")
    found = resolve_gres_positions([0, 1, 2], INVENTORY, conf, "n1")
    assert [g.minor for g in found] == [3, 5, 7]


def test_a_position_beyond_gres_conf_is_an_error(tmp_path: Path) -> None:
    conf = _gres(tmp_path, "Name=gpu File=/dev/null\n")
    with pytest.raises(GpuError, match=r"Slurm GPU position not in gres\.conf"):
        resolve_gres_positions([1], INVENTORY, conf, "n1")


def test_a_gres_file_that_is_not_a_character_device_is_an_error(tmp_path: Path) -> None:
    conf = _gres(tmp_path, f"Name=gpu File={tmp_path}\n")
    with pytest.raises(GpuError, match="not a character device"):
        resolve_gres_positions([0], INVENTORY, conf, "n1")


def test_user_lists_are_nvml_indices_and_uuids(tmp_path: Path) -> None:
    uuid = INVENTORY.gpus[2].uuid
    assert [g.index for g in resolve_gpus(f"1,{uuid}", INVENTORY)] == [1, 2]
    assert [g.index for g in resolve_gpus("0-1", INVENTORY)] == [0, 1]
    with pytest.raises(GpuError, match="GPU listed twice"):
        resolve_gpus(f"2,{uuid}", INVENTORY)
    with pytest.raises(GpuError, match="no such GPU"):
        resolve_gpus("3", INVENTORY)
