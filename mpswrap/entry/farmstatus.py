"""``mpswrap farm status [DIR]``: what the farms' journals say, from any shell, while they run
or after they ended (``taskfarm.status``: each journal folded, and whether its farm runs)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from ..errors import LayoutError, UsageError
from ..jobenv import JobEnv
from ..report import plots
from ..taskfarm import status as farmstatus
from ..taskfarm.journal import read_journal
from .farm import task_list_dir

__all__ = ["farm_status"]

log = logging.getLogger(__name__)


def farm_status(
    directory: str | None, as_json: bool, plot: str | None = None, failed: bool = False
) -> int:
    """``mpswrap farm status [DIR]``: what the farms' journals say, from any shell. DIR: a
    farm's directory, or its task list (``<TASKS>.farm``); none: every ``*.farm`` here.
    ``failed``: only the failed tasks, one a line. ``plot``: also save K and throughput over
    time there (``report.plots``; one farm directory)."""
    if plot:
        plots.ready(plot)  # refused before anything is read or printed
    paths = _status_dirs(directory)
    if plot and len(paths) > 1:
        raise UsageError("farm status --plot: one farm at a time", hint=_STATUS_HINT)
    alive = farmstatus.liveness(JobEnv.current())
    now, records, lines = time.time(), [], []
    journals = _journals(paths, asked=directory is not None)
    for path, journal in journals.items():
        shares, totals = farmstatus.directory_status(journal, alive)
        records.append(farmstatus.status_json(path, shares, totals, now))
        lines += farmstatus.failed_lines(totals) if failed else []
        lines += [] if failed else farmstatus.status_lines(path, shares, now)
    if as_json:
        print(json.dumps(records[0] if directory else {"farms": records}, indent=1))
    elif lines:
        print("\n".join(lines))
    if plot:
        plots.plot_packing(records[0], plot, title=f"farm {next(iter(journals))}")
        print(f"farm status: plot saved to {plot}", file=sys.stderr if as_json else sys.stdout)
    return 0


def _journals(paths: list[str], asked: bool) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Each directory's journals. The one ``asked`` about must be a farm's; of every ``*.farm``
    here, one that is none (a farm that failed to start, a user's own) is passed over with a
    warning, unless none is a farm."""
    if asked:
        return {paths[0]: _journal(paths[0])}
    found = {}
    for path in paths:
        try:
            found[path] = _journal(path)
        except UsageError as exc:
            log.warning("farm status: passed over: %s", exc.line())
    if not found:
        raise UsageError(
            "no farm here", cause="no *.farm directory has a journal", hint=_STATUS_HINT
        )
    return found


def _journal(path: str) -> dict[str, list[dict[str, Any]]]:
    try:
        journal = read_journal(path)
    except LayoutError as exc:
        raise UsageError(exc.what, thing=exc.thing, cause=exc.cause, hint=_STATUS_HINT) from None
    if not journal:
        raise UsageError("not a farm directory (no state file)", thing=path, hint=_STATUS_HINT)
    return journal


_STATUS_HINT = "give the farm's directory (--dir, default <TASKS>.farm) or its task list"


def _status_dirs(given: str | None) -> list[str]:
    """The directory asked about, or every ``*.farm`` here (a UsageError where none is)."""
    if given is not None:
        return [given if not os.path.isfile(given) else task_list_dir(None, given)]
    here = sorted(n for n in os.listdir(".") if n.endswith(".farm") and os.path.isdir(n))
    if not here:
        raise UsageError("no farm here", cause="no *.farm directory", hint=_STATUS_HINT)
    return here
