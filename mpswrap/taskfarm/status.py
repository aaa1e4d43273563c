"""``mpswrap farm status [DIR]``: how a farm is doing, asked from any shell, while it runs or
after it ended.

Everything comes from the farm's journal, its state files (``farm.tasks``): a ``farm`` event
when a farm begins (its node, PID and start time, the share's tasks, K, the GPUs), a ``k``
event for each GPU's K as it starts and each time it changes (``job.packing``), a ``start``
event for each attempt, a record for each finished one, and an ``end`` event. Each
share of the directory (one state file) is folded into the progress line's ``Counts``, and
shown with the progress line's words and ETA (``farmview``): the two cannot disagree. A
started attempt without its record is running while the farm that started it runs; a farm
without its ``end`` whose process is gone (killed outright) runs nothing, and its started
attempts count as not run, as the next run of the farm will run them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import _proc
from .._struct import Struct, field
from ..errors import shown
from .engine import Counts
from .packing import Change
from .tasks import record_of
from .view import duration, eta, k_path

__all__ = ["RunningTask", "ShareStatus", "fold", "process_alive", "status_json", "status_lines"]

#: Whether the farm process (node, pid, its start time) runs: None where it cannot be told
#: from here (another node).
Alive = Callable[[str, int, float], "bool | None"]
#: How the ETA is computed, for people and for ``--json``.
ETA_RULE = (
    "mean time of the finished attempts; each task not started takes the mean, each running "
    "one the mean less its age; spread over K x GPUs places"
)


class RunningTask(Struct, frozen=True):
    task: int
    line: int
    attempt: int
    node: str
    gpu: str
    gpu_index: int
    since: float


class ShareStatus(Struct):
    """One state file: the last farm that ran with it, and its tasks."""

    name: str
    #: ``running``, ``ended``, ``gone`` (no ``end``, its process gone), ``elsewhere`` (on
    #: another node: whether it still runs cannot be told here), ``unknown`` (no ``farm``
    #: event: written by an older mpswrap).
    state: str
    counts: Counts
    done_before: int = 0
    node: str = ""
    pid: int = 0
    ended: float | None = None
    code: int | None = None
    running: list[RunningTask] = field(default_factory=list)
    #: Each GPU's K and how it went: GPU UUID -> (its position, its changes).
    packing: dict[str, tuple[int, list[Change]]] = field(default_factory=dict)
    #: The GPUs whose K is found as the farm runs (``--per-gpu auto``).
    auto: set[str] = field(default_factory=set)

    @property
    def not_run(self) -> int:
        return self.counts.total - self.counts.finished - self.counts.running


def process_alive(here: str) -> Alive:
    def alive(node: str, pid: int, start: float) -> bool | None:
        if node != here:
            return None
        return _proc.is_alive(_proc.ProcId(pid, start))

    return alive


def fold(name: str, lines: Sequence[dict[str, Any]], alive: Alive) -> ShareStatus:
    """A state file's lines, from its last ``farm`` event on, as ``ShareStatus``."""
    begins = [i for i, d in enumerate(lines) if d.get("event") == "farm"]
    head = lines[begins[-1]] if begins else None
    run = lines[begins[-1] + 1 :] if begins else list(lines)
    records = [r for r in map(record_of, run) if r is not None]
    if head is None:
        status = ShareStatus(name, "unknown", Counts(len({r.task for r in records}), 0.0))
    else:
        status = _begun(name, head, run, alive)
    started: dict[tuple[int, int], RunningTask] = {}
    for data in run:
        if data.get("event") == "start":
            task = _running(data)
            if task is not None:
                started[(task.task, task.attempt)] = task
        elif data.get("event") == "k":
            _k_event(status, data)
    for record in records:
        started.pop((record.task, record.attempt), None)
        status.counts.count(record.status, record.seconds, record.retried)
    if status.packing:  # the places of the ETA: each GPU's K now
        status.counts.slots = sum(h[-1].k for _, h in status.packing.values() if h)
    if status.state in ("running", "elsewhere"):
        status.running = sorted(started.values(), key=lambda t: t.since)
    status.counts.since = [t.since for t in status.running]
    return status


def _begun(
    name: str, head: dict[str, Any], run: Sequence[dict[str, Any]], alive: Alive
) -> ShareStatus:
    node, pid = _word(head.get("node", "")), _int(head.get("pid"))
    counts = Counts(_int(head.get("todo")), _float(head.get("time")), slots=_int(head.get("slots")))
    status = ShareStatus(name, "running", counts, _int(head.get("skipped")), node, pid)
    end = next((d for d in run if d.get("event") == "end"), None)
    if end is not None:
        status.state, status.ended = "ended", _float(end.get("time"))
        status.code = end.get("code") if isinstance(end.get("code"), int) else None
        return status
    live = alive(node, pid, _float(head.get("pid_start")))
    status.state = {True: "running", False: "gone", None: "elsewhere"}[live]
    return status


#: The reasons a K event may give (others are shown as ``?``).
WHYS = ("start", "raise", "lower", "hold", "back-off", "oom", "memory")


def _k_event(status: ShareStatus, data: dict[str, Any]) -> None:
    k = _int(data.get("k"))
    if k < 1:
        return
    rate = data.get("throughput")
    why = data.get("why")
    change = Change(
        _float(data.get("t")),
        k,
        None if rate is None else _float(rate),
        why if why in WHYS else "?",
    )
    gpu = _word(data.get("gpu", ""))
    if data.get("auto") is True:
        status.auto.add(gpu)
    status.packing.setdefault(gpu, (_int(data.get("gpu_index")), []))[1].append(change)


def _running(data: dict[str, Any]) -> RunningTask | None:
    try:
        return RunningTask(
            int(data["task"]),
            int(data.get("line", 0)),
            int(data["attempt"]),
            _word(data.get("node", "")),
            _word(data.get("gpu", "")),
            int(data.get("gpu_index", 0)),
            _float(data["time"]),
        )
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: Any) -> float:
    """A finite number from the journal, else 0 (``Infinity`` and ``NaN`` parse as JSON)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if math.isfinite(value) else 0.0


def _word(value: Any) -> str:
    """A name from the journal (the farm user's file), as ``errors.shown`` shows it to
    whoever reads the status, root included."""
    return shown(str(value if value is not None else ""), 200)


# --- words --------------------------------------------------------------------------------------
def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


def _how(share: ShareStatus, now: float) -> str:
    where = f"on node {share.node} (pid {share.pid})"
    began = share.counts.started
    since = f"started {_clock(began)}, {duration(now - began)} ago"
    return {
        "running": f"running {where}, {since}",
        "elsewhere": f"{where}, {since}; whether it still runs cannot be told from here",
        "gone": f"not running: the farm {where} stopped without its summary (killed?); {since}",
        "ended": f"ended {_clock(share.ended or began)}, exit code {share.code}",
        "unknown": "no farm recorded its start here (an older mpswrap): finished tasks only",
    }[share.state]


def status_lines(directory: str, shares: Sequence[ShareStatus], now: float) -> list[str]:
    """What ``mpswrap farm status`` prints."""
    lines = []
    for share in shares:
        counts = share.counts
        label = "" if share.name == "state.jsonl" else f" [{share.name}]"
        lines.append(f"farm {directory}{label}: {_how(share, now)}")
        head = (
            f"  {counts.total + share.done_before} task(s): {counts.done} done, {counts.failed}"
            f" failed,{f' {counts.oom} oom,' if counts.oom else ''} {counts.running} running,"
            f" {share.not_run} not run,"
            f" {share.done_before} done before"
        )
        if counts.retried:
            head += f"; {counts.retried} attempt(s) retried"
        left = eta(counts, now) if share.state in ("running", "elsewhere") else None
        if left is not None and share.not_run + counts.running:
            head += f"; ETA {duration(left)} ({_eta_basis(counts)})"
        lines.append(head)
        for gpu, (index, history) in sorted(share.packing.items(), key=lambda p: p[1][0]):
            if gpu in share.auto:  # a K given is the command line's
                lines.append(f"  K on gpu {index}: {k_path(history)}")
        for task in share.running:
            lines.append(
                f"  running: task {task.task} (line {task.line}) on gpu {task.gpu_index}"
                f"{' of ' + task.node if task.node != share.node else ''}, attempt "
                f"{task.attempt}, since {_clock(task.since)} ({duration(now - task.since)})"
            )
    return lines


def _eta_basis(counts: Counts) -> str:
    mean = counts.busy / counts.attempts if counts.attempts else 0.0
    return f"mean {mean:.1f} s of {counts.attempts} attempt(s), {counts.slots} at once"


def status_json(directory: str, shares: Sequence[ShareStatus], now: float) -> dict[str, Any]:
    """What ``mpswrap farm status --json`` prints."""
    farms = [_share_json(s, now) for s in shares]
    totals = {k: sum(f[k] for f in farms) for k in ("tasks", "done", "failed", "oom", "running")}
    totals.update(not_run=sum(f["not_run"] for f in farms))
    totals.update(done_before=sum(f["done_before"] for f in farms))
    packing = {gpu: k for f in farms for gpu, k in f["packing"].items()}
    return {
        "directory": directory,
        "time": now,
        **totals,
        "packing": packing,
        "eta_rule": ETA_RULE,
        "shares": farms,
    }


def _share_json(share: ShareStatus, now: float) -> dict[str, Any]:
    counts = share.counts
    left = eta(counts, now) if share.state in ("running", "elsewhere") else None
    return {
        "state_file": share.name,
        "state": share.state,
        "node": share.node,
        "pid": share.pid,
        "started": counts.started or None,
        "ended": share.ended,
        "exit_code": share.code,
        "tasks": counts.total + share.done_before,
        "done": counts.done,
        "failed": counts.failed,
        "oom": counts.oom,
        "running": counts.running,
        "not_run": share.not_run,
        "done_before": share.done_before,
        "retried": counts.retried,
        "mean_attempt_s": counts.busy / counts.attempts if counts.attempts else None,
        "places": counts.slots,
        "packing": {
            gpu: {"k": history[-1].k, "history": [c.to_json() for c in history]}
            for gpu, (_, history) in share.packing.items()
            if history
        },
        "eta_s": left,
        "running_tasks": [
            {
                "task": t.task,
                "line": t.line,
                "attempt": t.attempt,
                "node": t.node,
                "gpu": t.gpu,
                "gpu_index": t.gpu_index,
                "since": t.since,
            }
            for t in share.running
        ],
    }
