"""The driver's word on MPS (CU_DEVICE_ATTRIBUTE_MPS_ENABLED) in ``check_attached``: a fake
libcuda, and a daemon that never lists this process (as from another PID namespace)."""

from __future__ import annotations

import ctypes
import time
from pathlib import Path
from typing import Any

import pytest

from mpswrap.config import load_settings
from mpswrap.errors import MpswrapError
from mpswrap.job import attached
from mpswrap.job.attached import Session
from mpswrap.mps import cuda


class FakeCuda:
    def __init__(self, context: int, mps: int, attribute_rc: int = 0) -> None:
        self.context, self.mps, self.attribute_rc = context, mps, attribute_rc
        self.asked: list[int] = []

    def cuCtxGetCurrent(self, ctx: Any) -> int:
        ctx._obj.value = self.context
        return 0

    def cuCtxGetDevice(self, dev: Any) -> int:
        dev._obj.value = 0
        return 0

    def cuDeviceGetAttribute(self, value: Any, attribute: int, dev: Any) -> int:
        self.asked.append(attribute)
        value._obj.value = self.mps
        return self.attribute_rc


@pytest.mark.parametrize(
    ("lib", "said"),
    [
        (FakeCuda(context=0x1234, mps=1), True),
        (FakeCuda(context=0x1234, mps=0), False),
        (FakeCuda(context=0, mps=1), None),  # no current context: cannot say
        (FakeCuda(context=0x1234, mps=1, attribute_rc=1), None),  # a driver without it
    ],
)
def test_the_driver_says_whether_the_context_uses_mps(
    monkeypatch: pytest.MonkeyPatch, lib: FakeCuda, said: bool | None
) -> None:
    monkeypatch.setattr(ctypes, "CDLL", lambda *_a, **_k: lib)
    assert cuda.mps_client() is said
    assert lib.asked in ([], [133])


def test_no_libcuda_loaded_means_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(*_a: object, **_k: object) -> Any:
        raise OSError("libcuda.so.1: not loaded")

    monkeypatch.setattr(ctypes, "CDLL", absent)
    assert cuda.mps_client() is None


class NeverListed:
    def has_client(self, pids: set[int]) -> int | None:
        return None


def _session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Session:
    sess = Session("GPU-1", 0, 1, tmp_path, tmp_path, None, "user", {}, load_settings({}))
    monkeypatch.setattr(Session, "_control", lambda self: NeverListed())
    return sess


@pytest.mark.parametrize(
    ("driver", "outcome"), [(True, 0), (False, "driver says"), (None, "client list")]
)
def test_check_attached_takes_the_drivers_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, driver: bool | None, outcome: object
) -> None:
    sess = _session(tmp_path, monkeypatch)
    monkeypatch.setattr(attached, "mps_client", lambda: driver)
    start = time.monotonic()
    if outcome == 0:
        assert sess.check_attached(timeout=30) == 0
        assert time.monotonic() - start < 10, "the driver's yes waits 2 s for the listing"
        return
    with pytest.raises(MpswrapError) as caught:
        sess.check_attached(timeout=0.2)
    assert str(outcome) in caught.value.line()
    if driver is False:
        assert time.monotonic() - start < 0.2, "the driver's no needs no wait"
