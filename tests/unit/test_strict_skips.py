"""Strict skips (tests/strict_skips.py), run on tiny test files in a pytest subprocess."""

from __future__ import annotations

import pytest

from tests.tree import REPO

pytest_plugins = ["pytester"]
TESTS = {
    "test_a": """
        import pytest

        def test_runs():
            pass

        def test_no_tool():
            pytest.skip("needs Open MPI mpirun")

        @pytest.mark.skipif(True, reason="needs root")
        def test_no_root():
            pass

        @pytest.mark.xfail(reason="known bug")
        def test_known_bug():
            assert False
    """,
    "test_b": """
        import pytest

        pytest.skip("module needs the simulator", allow_module_level=True)
    """,
}


def _run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, allowed: str | None
) -> pytest.RunResult:
    pytester.makepyfile(**TESTS)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("MPS_STRICT_SKIPS", "1")
    monkeypatch.delenv("MPS_ALLOWED_SKIPS", raising=False)  # tools/test.sh sets its own
    if allowed is not None:
        pytester.makefile(".txt", allowed=allowed)
        monkeypatch.setenv("MPS_ALLOWED_SKIPS", str(pytester.path / "allowed.txt"))
    return pytester.runpytest_subprocess("-p", "tests.strict_skips")


def test_an_unexpected_skip_fails_the_run_and_is_named(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = _run(pytester, monkeypatch, "# why\nneeds root\n")
    assert res.ret == 1, res.stdout.str()
    res.assert_outcomes(passed=1, skipped=3, xfailed=1)
    refused = sorted(ln for ln in res.outlines if ln.startswith("SKIP NOT ALLOWED"))
    assert refused == [
        "SKIP NOT ALLOWED test_a.py::test_no_tool: needs Open MPI mpirun",
        "SKIP NOT ALLOWED test_b.py: module needs the simulator",
    ]


def test_no_allow_list_allows_no_skip(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = _run(pytester, monkeypatch, None)
    assert res.ret == 1, res.stdout.str()
    assert sum(ln.startswith("SKIP NOT ALLOWED") for ln in res.outlines) == 3


def test_allowed_skips_pass(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    res = _run(pytester, monkeypatch, "needs root  # a comment\nmpirun\nthe simulator\n")
    assert res.ret == 0, res.stdout.str()
    assert "SKIP NOT ALLOWED" not in res.stdout.str()


def test_without_strict_skips_a_skip_passes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(**TESTS)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.delenv("MPS_STRICT_SKIPS", raising=False)  # tools/test.sh sets it
    res = pytester.runpytest_subprocess("-p", "tests.strict_skips")
    assert res.ret == 0, res.stdout.str()
    res.assert_outcomes(passed=1, skipped=3, xfailed=1)
