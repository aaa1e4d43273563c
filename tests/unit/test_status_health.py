"""What ``mpswrap status`` calls not healthy (``report.status.unhealthy``): pure."""

from __future__ import annotations

from typing import Any

import pytest

from mpswrap.report.status import unhealthy


def _job(state: str) -> dict[str, Any]:
    server = {"pid": 12, "status": state, "clients": []}
    gpu = {"key": "g0", "daemon": {"pid": 11, "alive": True}, "servers": [server], "faults": []}
    return {"job": "7", "node": "n1", "job_dir": "/run/mpswrap/n1/7", "gpus": [gpu]}


@pytest.mark.parametrize("state", ["ACTIVE", "INITIALIZING"])
def test_a_server_serving_or_starting_is_healthy(state: str) -> None:
    assert unhealthy(_job(state)) == []


def test_a_server_in_any_other_state_is_named() -> None:
    assert unhealthy(_job("FAULT")) == ["job 7 on n1, g0: server 12 is FAULT"]
