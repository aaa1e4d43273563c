"""pytest plugin of tools/gpu_rehearsal/run.sh: every test's environment points at the
simulator (set again after tests/conftest.py clears MPSWRAP_*), and so does what the GPU
tests build for their programs (``conftest.base_env``)."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

ENV = {
    "MPSWRAP_GPU_INVENTORY": os.environ["MPSWRAP_GPU_INVENTORY"],
    "MPSWRAP_START_TIMEOUT": "10",
    "MPSWRAP_TERMINATE_TIMEOUT": "3",
    "MPSWRAP_QUIT_TIMEOUT": "2",
    "MPSWRAP_COMMAND_TIMEOUT": "3",
    "MPSWRAP_TERMINATE_WINDOW": os.environ.get("REHEARSE_WINDOW", "0.5"),
}


@pytest.fixture(autouse=True)
def rehearse_env(clean_job_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    for name, module in list(sys.modules.items()):
        original = getattr(module, "base_env", None)
        if name.startswith("tests.gpu.") and original is not None:
            monkeypatch.setattr(module, "base_env", _with_simulator(original))


def _with_simulator(original: Any) -> Any:
    def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
        env: dict[str, str] = original(extra)
        env["PATH"] = f"{os.environ['REHEARSE_BIN']}:{env['PATH']}"
        return {**env, **ENV}

    return base_env
