"""A hook's log lines: stderr always, syslog (``/dev/log``) as well where the ``syslog`` setting
asks for it, never from the task prolog (a line per task)."""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
from collections.abc import Iterator

import pytest

from mpswrap.cli.logs import setup_logging
from mpswrap.config import load_settings
from mpswrap.entry import hooks
from mpswrap.jobenv import JobEnv


class _SysLog(logging.Handler):
    """Stands in for SysLogHandler: this machine may have no syslog socket."""

    addresses: list[object] = []  # noqa: RUF012 - what each instance was made with

    def __init__(self, address: object) -> None:
        super().__init__()
        self.addresses.append(address)


@pytest.fixture
def logger(monkeypatch: pytest.MonkeyPatch) -> Iterator[logging.Logger]:
    monkeypatch.setattr(logging.handlers, "SysLogHandler", _SysLog)
    exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda path: path == "/dev/log" or exists(path))
    _SysLog.addresses.clear()
    root = logging.getLogger("mpswrap")
    saved = (root.handlers[:], root.level, root.propagate)
    yield root
    root.handlers[:], root.level, root.propagate = saved


@pytest.mark.parametrize(
    ("hook", "syslog", "to_syslog"),
    [
        ("prolog", "yes", True),
        ("epilog", "yes", True),
        ("prolog", "no", False),
        ("task-prolog", "yes", False),
    ],
)
def test_a_hook_logs_to_syslog_where_the_setting_asks(
    logger: logging.Logger, hook: str, syslog: str, to_syslog: bool
) -> None:
    settings = load_settings(env={"MPSWRAP_SYSLOG": syslog}, problems=[])
    hooks._setup_logging(hook, JobEnv({"SLURM_JOB_ID": "7"}), settings)
    kinds = [type(h) for h in logger.handlers]
    assert kinds == ([logging.StreamHandler, _SysLog] if to_syslog else [logging.StreamHandler])
    assert _SysLog.addresses == (["/dev/log"] if to_syslog else [])


@pytest.mark.parametrize("hook", [None, "epilog"], ids=["command-line", "hook"])
def test_every_log_line_escapes_what_a_job_user_wrote(
    logger: logging.Logger, capsys: pytest.CaptureFixture[str], hook: str | None
) -> None:
    """The command line's log lines (root's ``status``: a control reply, a fault's stamp)
    and the hooks' go through one formatter: one line, no escape sequence."""
    if hook is None:
        setup_logging(argparse.Namespace(debug=False, verbose=0, quiet=0), "info")
    else:
        hooks._setup_logging(hook, JobEnv({"SLURM_JOB_ID": "7"}), None)
    logging.getLogger("mpswrap.report").warning("server is %s", "\x1b[2J\x1b]0;pwned\x07\nx")
    said = capsys.readouterr().err
    assert "\x1b" not in said and said.count("\n") == 1, repr(said)
    assert "server is \\x1b[2J" in said, repr(said)
