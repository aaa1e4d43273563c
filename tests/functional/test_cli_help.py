"""What the command line says about itself, all made from the command table: each command's help
(a description and two examples), every option's default, the man page as ``man`` renders it,
and bash completion as a real bash runs it."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mpswrap.cli import main as cli
from mpswrap.cli import manpage
from mpswrap.cli.options import LAUNCHERS
from mpswrap.config import OTHER_VARIABLES
from tests.tree import REPO

pytestmark = pytest.mark.functional


def _commands() -> dict[str, argparse.ArgumentParser]:
    return {name: parser for name, parser in cli.parsers().items() if name}


COMMANDS = list(_commands())


def _mpswrap(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "mpswrap", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_a_description_and_two_examples(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["help", *name.split()], [*name.split(), "--help"]):
        assert cli.main(argv) == 0
        text = capsys.readouterr().out
        usage, description, *_ = text.split("\n\n")
        assert usage.startswith(f"usage: mpswrap {name}"), text
        assert len(description.split()) >= 5, text
        examples = text.split("examples:\n")[1].splitlines()
        assert len([e for e in examples if e.startswith("  ") and "mpswrap" in e]) == 2, text


@pytest.mark.parametrize(
    ("name", "absent"), [("farm", "--policy"), ("calibrate", "--verify-attach")]
)
def test_a_command_offers_only_options_that_act_on_it(
    name: str, absent: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An option with no effect on a command is not one of its options: refused by name."""
    assert cli.main([name, "--help"]) == 0
    assert absent not in capsys.readouterr().out
    assert cli.main([absent, "x", name, "tasks.txt"]) == 2
    assert f"mpswrap: unknown option '{absent}'" in capsys.readouterr().err


def _actions() -> list[tuple[str, argparse.Action]]:
    return [
        (name, action)
        for name, parser in cli.parsers().items()
        for action in parser._actions
        if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
    ]


def test_every_option_that_takes_a_value_says_its_default() -> None:
    """In its help (--help, the man page) and so in docs/reference.md's default column."""
    missing = [
        f"mpswrap {name} {action.option_strings or action.metavar}"
        for name, action in _actions()
        if action.nargs != 0
        and not action.required
        and not re.search(r"\((default: [^)]|required\))", action.help or "")
    ]
    assert not missing, missing


def test_the_reference_shows_a_default_for_every_option() -> None:
    text = (REPO / "docs" / "reference.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (`-[^|]*`) \| ([^|]*) \|", text, re.M)
    assert len(rows) > 100
    empty = [option for option, default in rows if not default.strip()]
    assert not empty, empty


@pytest.mark.skipif(shutil.which("man") is None, reason="man-db is not installed")
def test_the_man_page_renders_without_warnings() -> None:
    res = _mpswrap("help", "--man-path")
    assert res.returncode == 0, res
    page = Path(res.stdout.strip())
    assert page == manpage.shipped() and page.is_file()
    env = {**os.environ, "MANWIDTH": "80", "LC_ALL": "C.UTF-8"}
    shown = subprocess.run(
        ["man", "--warnings=all", "-P", "cat", "-l", str(page)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0 and not shown.stderr, shown.stderr
    for name in COMMANDS:
        assert f"mpswrap {name}\n" in shown.stdout, name
    assert "EXIT STATUS" in shown.stdout and "--verify-timeout S" in shown.stdout
    environment = shown.stdout.split("\nENVIRONMENT\n", 1)[1].split("\nFILES\n", 1)[0]
    named = {n for names, _, _ in OTHER_VARIABLES for n in names}
    assert named and {n for n in named if n not in environment} == set()


def _complete(script: str, *words: str) -> list[str]:
    """What a real bash offers for ``words`` (the last one being completed)."""
    code = 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _mpswrap; '
    code += 'printf "%s\\n" "${COMPREPLY[@]}"'
    res = subprocess.run(
        ["bash", "--norc", "-c", code, "bash", script, *words],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0 and not res.stderr, res.stderr
    return sorted(w for w in res.stdout.splitlines() if w)


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> str:
    res = _mpswrap("completion", "bash")
    assert res.returncode == 0, res
    path = tmp_path_factory.mktemp("completion") / "mpswrap"
    path.write_text(res.stdout)
    return str(path)


def test_completion_completes_commands(script: str) -> None:
    assert _complete(script, "mpswrap", "ru") == ["run"]
    assert _complete(script, "mpswrap", "--gpus", "0", "st") == ["start", "status", "stop"]
    assert _complete(script, "mpswrap", "") == sorted(
        {*(c.split()[0] for c in COMMANDS), *LAUNCHERS}
    )
    assert _complete(script, "mpswrap", "help", "ca") == ["calibrate"]
    assert _complete(script, "mpswrap", "help", "") == sorted(
        {c for c in COMMANDS if " " not in c}
    )  # the commands help knows, no launcher
    assert _complete(script, "mpswrap", "help", "farm", "") == ["status"]
    assert "status" in _complete(script, "mpswrap", "farm", "")  # farm status, or a task file
    assert _complete(script, "mpswrap", "farm", "status", "--j") == ["--json"]
    # the simulator's commands, and each one's options
    assert _complete(script, "mpswrap", "sim", "") == ["install-bin", "inventory"]
    assert _complete(script, "mpswrap", "help", "sim", "") == ["install-bin", "inventory"]
    assert _complete(script, "mpswrap", "sim", "install-bin", "--") == ["--faults", "--help"]
    assert _complete(script, "mpswrap", "sim", "inventory", "--") == ["--gpus", "--help"]
    assert _complete(script, "mpswrap", "sim", "inventory", "--gpus", "") == []


def test_completion_finds_the_command_after_its_options_and_after_equals_forms(
    script: str,
) -> None:
    """A command's options before its word (``mpswrap --per-gpu 2 farm``), and ``--opt=value``
    (three words for bash: COMP_WORDBREAKS holds '='), still leave the command word found."""
    assert _complete(script, "mpswrap", "--per-gpu", "2", "farm", "--per") == ["--per-gpu"]
    assert "--watch" in _complete(script, "mpswrap", "--config", "f.conf", "status", "--")
    assert _complete(script, "mpswrap", "-n", "2", "run", "--pol") == ["--policy"]
    assert _complete(script, "mpswrap", "--gpus", "=", "0", "run", "--pol") == ["--policy"]
    assert _complete(script, "mpswrap", "run", "--policy", "=", "") == [
        "affinity",
        "block",
        "cyclic",
    ]
    assert _complete(script, "mpswrap", "--json", "status", "--wat") == ["--watch"]


@pytest.mark.parametrize("name", COMMANDS)
def test_completion_completes_each_commands_own_options(script: str, name: str) -> None:
    parser = _commands()[name]
    want = sorted(f for a in parser._actions for f in a.option_strings if f.startswith("--"))
    assert _complete(script, "mpswrap", *name.split(), "--") == want


def test_completion_completes_option_values(script: str) -> None:
    assert _complete(script, "mpswrap", "farm", "--progress", "") == ["auto", "bar", "lines", "off"]
    assert _complete(script, "mpswrap", "--policy", "c") == ["cyclic"]
    assert _complete(script, "mpswrap", "run", "-n", "2", "--policy", "") == [
        "affinity",
        "block",
        "cyclic",
    ]
    assert _complete(script, "mpswrap", "demo", "--simulate", "y") == ["yes"]
    # A number or a name is typed: no option name is offered as the value.
    for words in (["run", "-n"], ["run", "--job"], ["status", "--watch"], ["--gpus"]):
        assert _complete(script, "mpswrap", *words, "") == [], words
