"""Fixtures of the real-Slurm tests (marked ``slurm``); see harness.py.

``cluster`` (session): one 2-node test cluster with mpswrap's hooks installed, brought up
once and torn down at the end. ``_slurm_nothing_left`` (autouse, slurm tests only): after
every test, fail loudly if a node is drained or anything of a job survived, then repair, so
one broken test does not break the ones after it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import Cluster, running_cluster, why_not_runnable


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    reason = why_not_runnable()
    if reason:
        pytest.skip(reason)
    with running_cluster(lambda: request.session.testsfailed > 0) as made:
        yield made


@pytest.fixture(autouse=True)
def _slurm_nothing_left(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("slurm") is None:
        yield
        return
    made: Cluster = request.getfixturevalue("cluster")
    yield
    problems = made.check_clean()
    if problems:
        pytest.fail("after this test:\n  " + "\n  ".join(problems), pytrace=False)


@pytest.fixture
def workdir(cluster: Cluster, request: pytest.FixtureRequest) -> Path:
    """A fresh directory owned by the job user (job scripts, output, client records)."""
    return cluster.workdir(re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:60])
