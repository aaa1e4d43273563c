"""Strict skips: with ``MPS_STRICT_SKIPS=1`` a skip whose reason is not allowed fails the run.

A skip says "not tested here". Where everything the tests need is installed (CI, the GPU
machine), a skip hides a failure: a missing binary, user or privilege. ``MPS_ALLOWED_SKIPS``
names a file of allowed reasons, one substring per line (``#`` starts a comment); without it
no skip is allowed. tools/test.sh and tests/gpu/run_gpu_tier.sh set both. The variables are
not ``MPSWRAP_*``: mpswrap refuses unknown settings of that prefix, and the tests' children
inherit them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("MPS_STRICT_SKIPS") == "1":
        allowed = _allowed(os.environ.get("MPS_ALLOWED_SKIPS"))
        config.pluginmanager.register(StrictSkips(allowed), "mpswrap-strict-skips")


def _allowed(path: str | None) -> list[str]:
    if not path:
        return []
    lines = (line.split("#", 1)[0].strip() for line in Path(path).read_text().splitlines())
    return [line for line in lines if line]


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text[len("Skipped: ") :] if text.startswith("Skipped: ") else text


class StrictSkips:
    """Collects every skip (at collection, setup or call) and judges them at the end."""

    def __init__(self, allowed: list[str]) -> None:
        self.allowed = allowed
        self.refused: list[tuple[str, str]] = []

    def _note(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        reason = _reason(report)
        if not any(text in reason for text in self.allowed):
            self.refused.append((report.nodeid, reason))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._note(report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._note(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.refused and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.refused:
            return
        terminalreporter.write_sep("=", "skips not allowed here (MPS_STRICT_SKIPS=1)", red=True)
        for nodeid, reason in self.refused:
            terminalreporter.write_line(f"SKIP NOT ALLOWED {nodeid}: {reason}")
