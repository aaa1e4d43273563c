"""The task prolog tells each task where the admin file is, when it is not at the default
path, in a line slurmstepd reads as one variable."""

from __future__ import annotations

import pytest

from mpswrap.config import DEFAULT_CONFIG_FILE, load_settings
from mpswrap.entry.hooks import task_prolog
from mpswrap.jobenv import JobEnv


def _exports(config: str | None, capsys: pytest.CaptureFixture[str]) -> list[str]:
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "batch", "SLURMD_NODENAME": "n1"}
    if config is not None:
        env["MPSWRAP_CONFIG"] = config
    assert task_prolog(JobEnv(env), load_settings(env={})) == 0
    return capsys.readouterr().out.splitlines()


def test_a_config_at_another_path_reaches_the_batch_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _exports("/opt/site/mpswrap.conf", capsys) == [
        "export MPSWRAP_CONFIG=/opt/site/mpswrap.conf"
    ]


@pytest.mark.parametrize("config", [None, DEFAULT_CONFIG_FILE])
def test_the_default_path_is_not_exported(
    config: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exports(config, capsys) == []


@pytest.mark.parametrize(
    "config", ["/etc/m.conf\nexport LD_PRELOAD=/x.so", "/etc/m conf", "m.conf"]
)
def test_a_path_that_is_not_plain_is_not_exported(
    config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exports(config, capsys) == []
