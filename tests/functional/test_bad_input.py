"""Bad input: one exact message, the documented exit code, and nothing created or left.

The cases live in bad_input_table.py, which also prints docs/reliability.md "Bad input".
Exit codes: usage and config errors 2, other errors 1; hooks follow the admin's failure
policy (prolog_failure = continue: 0; drain: 1; epilog_failure = drain: 1).
"""

from __future__ import annotations

import os

import pytest

from mpswrap.cli import main as cli
from mpswrap.cli.commands import HOOKS
from mpswrap.cli.options import WRAPPER_OPTIONS
from mpswrap.errors import ConfigError, MpswrapError, UsageError
from tests.functional.bad_input_table import CASES, Case, run_case

pytestmark = [
    pytest.mark.functional,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="cases run as root and as a test user"),
]


def test_the_table_is_big_enough_and_names_are_unique() -> None:
    assert len(CASES) >= 25
    assert len({c.name for c in CASES}) == len(CASES)
    areas = {c.area for c in CASES}
    assert {"environment", "arguments", "admin file", "GPU list", "job id", "path", "user"} <= areas


def test_exit_codes_follow_the_error_classes() -> None:
    assert UsageError("x").exit_code == ConfigError("x").exit_code == 2
    assert MpswrapError("x").exit_code == 1


#: Commands whose bad values are not judged here: the Slurm hooks exit by the admin's failure
#: policy, and install-hooks/uninstall-hooks change the system (tests/functional/
#: test_install_hooks.py runs them in a sandbox).
NOT_HERE = {*HOOKS, "install-hooks", "uninstall-hooks"}


def _valued_options() -> set[str]:
    """``COMMAND --FLAG`` for every option of every command that takes a value; the wrapper
    options of the launch modes (one table, one check) as ``--FLAG``."""
    wrapper = {flags[0] for flags, _ in WRAPPER_OPTIONS}
    found = {flags[0] for flags, kw in WRAPPER_OPTIONS if kw.get("action") != "store_true"}
    for name, command in cli.parsers().items():
        for action in command._actions:
            flag = next(iter(action.option_strings), None)
            if flag and action.nargs != 0 and flag not in wrapper and name not in NOT_HERE:
                found.add(f"{name} {flag}".strip())
    return found


def test_every_option_that_takes_a_value_has_a_bad_value_case() -> None:
    covered = {c.option for c in CASES if c.option and c.code == 2}
    assert not _valued_options() - covered, sorted(_valued_options() - covered)


@pytest.mark.parametrize("case", [c for c in CASES if c.option], ids=lambda c: c.name)
def test_a_bad_value_names_its_option(case: Case) -> None:
    flag = case.option.split()[-1]
    first = case.stderr.splitlines()[0]
    assert case.code == 2 and flag in first, (case.option, first)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case) -> None:
    out = run_case(case)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr == case.stderr, f"\n got: {out.stderr!r}\nwant: {case.stderr!r}"
    assert out.code == case.code, out.stderr
    lines = out.stderr.splitlines()
    assert all(ln.startswith(("mpswrap: ", "hint: ")) for ln in lines), lines
    if not case.hook and case.stderr:  # one error line, plus a hint where the user can act
        assert len([ln for ln in lines if not ln.startswith("hint: ")]) == 1, lines
    assert not out.created, f"created: {out.created}"
    assert not out.processes, f"left running: {out.processes}"
