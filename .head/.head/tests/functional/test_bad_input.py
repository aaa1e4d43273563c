"""Bad input: one exact message, the documented exit code, and nothing created or left.

The cases live in bad_input_table.py, which also prints docs/reliability.md "Bad input".
Exit codes: usage and config errors 2, other errors 1; hooks follow the admin's failure
policy (prolog_failure = continue: 0; drain: 1; epilog_failure = drain: 1).
"""

from __future__ import annotations

import os

import pytest

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
