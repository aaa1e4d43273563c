"""tools/gpu_rehearsal: enough of PyTorch for the multi phase's probe on the simulator. The
process becomes a simulated MPS client at its first tensor, and the driver's word on it
(``mpswrap.mps.cuda.mps_client``) is whether it is one."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import mpswrap.mps.cuda as _cuda
from mpswrap.sim.client import Client, parse

#: This process's simulated client, once it has a tensor.
_CLIENT: list[Client] = []


def _attach() -> None:
    if not _CLIENT:
        _CLIENT.append(Client(parse([])))
        if _CLIENT[0].attach() is None:
            raise RuntimeError("not an MPS client")


class _Tensor:
    def __init__(self, n: int) -> None:
        self.n = n

    def __matmul__(self, other: _Tensor) -> _Tensor:
        return _Tensor(self.n)

    def __getitem__(self, key: Any) -> _Tensor:
        return self

    def item(self) -> float:
        return float(self.n)


def ones(rows: int, cols: int, device: str | None = None) -> _Tensor:
    _attach()
    return _Tensor(cols)


class cuda:
    @staticmethod
    def device_count() -> int:
        return len([u for u in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if u])

    @staticmethod
    def device(index: int) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    @staticmethod
    def synchronize(index: int | None = None) -> None:
        pass

    @staticmethod
    def get_device_properties(index: int) -> object:
        return object()


_cuda.mps_client = lambda: bool(_CLIENT)
