"""The command line's log output: one ``mpswrap: ...`` line per record on stderr, at the level
the options, ``MPSWRAP_DEBUG`` or the ``log_level`` setting ask for, each escaped into one line
(``errors.LineFormatter``, the hooks' own)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ..config import load_settings
from ..errors import LineFormatter

__all__ = ["debug_env", "setup_logging"]


def setup_logging(args: argparse.Namespace | None, default: str) -> None:
    """Log level: --debug/-v/-q, else MPSWRAP_DEBUG=1, else the ``log_level`` setting
    (``MPSWRAP_LOG_LEVEL`` or the admin file) where one is set, else ``default``."""
    level = _level(args, default)
    handler = logging.StreamHandler(sys.stderr)
    # Debug lines say when (ms since this process started): where a teardown spends its time.
    # Every message is one escaped line, as the hooks' are: it may carry a job user's text.
    handler.setFormatter(LineFormatter("mpswrap", stamp_all=level <= logging.DEBUG))
    root = logging.getLogger("mpswrap")
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel(level)


def _level(args: argparse.Namespace | None, default: str) -> int:
    debug = bool(getattr(args, "debug", False))
    verbose, quiet = getattr(args, "verbose", 0) or 0, getattr(args, "quiet", 0) or 0
    if debug or verbose > quiet:
        return logging.DEBUG
    if quiet > verbose:
        return logging.WARNING if quiet - verbose == 1 else logging.ERROR
    if debug_env():
        return logging.DEBUG
    if args is not None:
        settings = load_settings(problems=[], config_file=getattr(args, "config", None))
        if settings.sources["log_level"] != "default":
            default = settings.log_level
    return logging.getLevelName(default.upper())  # type: ignore[no-any-return]


def debug_env() -> bool:
    return os.environ.get("MPSWRAP_DEBUG") == "1"
