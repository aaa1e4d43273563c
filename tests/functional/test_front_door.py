"""One front door: the ``mpswrap`` command, the hooks' fast path (``python -I -m mpswrap
prolog``) and ``python -m mpswrap.slurm`` all run a command through the one command table
(``cli.commands.invoke``), each command by its row."""

from __future__ import annotations

import runpy
import sys
from typing import Any

import pytest

from mpswrap.cli import commands
from mpswrap.cli import main as cli
from mpswrap.slurm import __main__ as slurm_main

pytestmark = pytest.mark.functional

#: The fewest words each command needs to parse.
MINIMAL = {
    "run": ["-n", "1", "--", "true"],
    "farm": ["tasks.txt"],
    "calibrate": ["--", "true"],
    "report": ["1"],
    "container-args": ["podman"],
    "sim": ["install-bin", "/nonexistent"],
}


@pytest.fixture
def invoked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    calls: list[tuple[str, Any]] = []

    def record(name: str, args: Any) -> int:
        calls.append((name, args))
        return 0

    monkeypatch.setattr(commands, "invoke", record)
    return calls


@pytest.mark.parametrize("name", [c.name for c in commands.COMMANDS])
def test_the_command_line_runs_every_command_through_its_row(
    name: str, invoked: list[tuple[str, Any]]
) -> None:
    assert cli.main([*name.split(), *MINIMAL.get(name, [])]) == 0
    assert [n for n, _ in invoked] == [name]
    assert invoked[0][1].command == name


def test_the_hooks_fast_path_runs_the_hooks_row(
    invoked: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for hook in commands.HOOKS:
        monkeypatch.setattr(sys, "argv", ["mpswrap", hook])
        with pytest.raises(SystemExit) as done:
            runpy.run_module("mpswrap", run_name="__main__")
        assert done.value.code == 0
        assert invoked[-1][0] == hook and invoked[-1][1].config is None


def test_python_m_mpswrap_slurm_runs_the_install_rows(invoked: list[tuple[str, Any]]) -> None:
    assert slurm_main.main(["install", "--dest", "/nonexistent"]) == 0
    assert slurm_main.main(["uninstall", "--force"]) == 0
    assert [n for n, _ in invoked] == ["install-hooks", "uninstall-hooks"]
    assert invoked[0][1].dest == "/nonexistent" and invoked[1][1].force


def test_python_m_mpswrap_slurm_refuses_other_words(
    invoked: list[tuple[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert slurm_main.main(["status"]) == 2
    assert capsys.readouterr().err.startswith("mpswrap: python -m mpswrap.slurm takes install")
    assert slurm_main.main(["--help"]) == 0
    assert not invoked
