"""``mpswrap farm status [DIR...]``: how a farm is doing, asked from any shell, while it runs or
after it ended: the fold of its journal (``fold``), in the progress line's words (``view``).

Each share of a directory (one journal) is one farm; every farm of the directories asked about
is shown, each task as the directory's record that settles it says (``journal.settled``, as a
farm run again reads them): a task another journal's farm ran since (another ``--share``
layout) counts as that farm left it. The directory's totals count each task of it once
(``tasktotals``).

A started attempt without its record is running while the farm that started it runs. Whether it
still runs: on its own node, its process (PID and start time); elsewhere, inside Slurm, Slurm's
state of the job the farm recorded (``scontrol``); else it cannot be told here. A farm without
its ``end`` whose process is gone (killed outright) runs nothing: its started attempts count as
not run, as the next run of the farm runs them. The failed tasks are listed with their exit
codes and logs (``--failed``: only them, one a line).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import _proc
from .._struct import Struct
from ..errors import MpswrapError, shown
from ..jobenv import JobEnv
from ..slurm.scontrol import job_state
from .fold import Tally, fold
from .journal import TaskRecord, settled
from .tasktotals import TaskTotals, task_totals
from .view import ETA_RULE, duration, eta
from .words import counts_words, failure_words, k_path

__all__ = [
    "Liveness",
    "ShareStatus",
    "directory_status",
    "failed_lines",
    "liveness",
    "share_status",
    "status_json",
    "status_lines",
]

#: Slurm's states of a job whose farm may still run.
SLURM_RUNNING = ("RUNNING", "COMPLETING", "SUSPENDED")
#: Whether the farm a journal's ``farm`` event names still runs: True, False, or None where it
#: cannot be told here; and the words of how that was told (``Slurm job 12 is RUNNING``).
Liveness = Callable[[dict[str, Any]], "tuple[bool | None, str]"]


class ShareStatus(Struct):
    """One journal: the last farm that ran with it, folded."""

    name: str
    #: ``running``, ``ended``, ``gone`` (no ``end``, its process or job gone), ``elsewhere``
    #: (whether it still runs cannot be told here), ``unknown`` (no ``farm`` event: written by
    #: an older mpswrap).
    state: str
    tally: Tally
    told: str = ""

    @property
    def node(self) -> str:
        return shown(str(self.tally.head.get("node", "")), 200)

    @property
    def live(self) -> bool:
        return self.state in ("running", "elsewhere")


def liveness(env: JobEnv) -> Liveness:
    """Whether the farm a journal names runs: its process where it ran on this node; elsewhere
    the state Slurm gives the job it recorded (asked only from inside a Slurm job); else None
    (cannot be told here)."""

    def alive(head: dict[str, Any]) -> tuple[bool | None, str]:
        pid, start = head.get("pid"), head.get("pid_start")
        if head.get("node") == env.node and type(pid) is int and isinstance(start, int | float):
            return _proc.is_alive(_proc.ProcId(pid, float(start))), ""
        job = head.get("job")
        if not isinstance(job, str) or not env.job_id:
            return None, ""
        try:
            state = job_state(env, job)
        except MpswrapError:
            state = None
        if state is None:
            return None, ""
        return state in SLURM_RUNNING, f"Slurm job {job} is {state}"

    return alive


def directory_status(
    journals: Mapping[str, Sequence[dict[str, Any]]], alive: Liveness
) -> tuple[list[ShareStatus], TaskTotals]:
    """Each journal of a directory as ``ShareStatus``, its tasks settled across them all, and
    the directory's tasks, each counted once (``tasktotals``)."""
    last = settled(journals)
    shares = [share_status(name, lines, alive, last) for name, lines in journals.items()]
    return shares, task_totals([(s.name, s.tally) for s in shares], last)


def share_status(
    name: str,
    lines: Sequence[dict[str, Any]],
    alive: Liveness,
    last: Mapping[str, TaskRecord] | None = None,
) -> ShareStatus:
    """A journal's lines as ``ShareStatus``; ``last``: each task's settling record in the
    directory (``journal.settled``), where other journals may have run its tasks since."""
    tally = fold(lines)
    tally.settle_by(last or {})
    if not tally.head:
        return ShareStatus(name, "unknown", tally)
    if tally.code is not None or tally.ended:
        return ShareStatus(name, "ended", tally)
    live, told = alive(tally.head)
    status = ShareStatus(name, {True: "running", False: "gone", None: "elsewhere"}[live], tally)
    status.told = told
    if not status.live:
        tally.running.clear()  # what a gone farm started runs again with the next one
        tally.settling.clear()
    return status


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


def _how(share: ShareStatus, now: float) -> str:
    head, began = share.tally.head, share.tally.started
    where = f"on node {share.node} (pid {shown(str(head.get('pid', 0)), 20)})"
    since = f"started {_clock(began)}, {duration(now - began)} ago"
    told = f" ({share.told})" if share.told else ""
    return {
        "running": f"running {where}{told}, {since}",
        "elsewhere": f"{where}, {since}; whether it still runs cannot be told from here",
        "gone": f"not running: the farm {where} stopped without its summary{told}; {since}",
        "ended": f"ended {_clock(share.tally.ended or began)}, exit code {share.tally.code}",
        "unknown": "no farm recorded its start here (an older mpswrap): finished tasks only",
    }[share.state]


def status_lines(directory: str, shares: Sequence[ShareStatus], now: float) -> list[str]:
    """What ``mpswrap farm status`` prints for one directory."""
    lines = []
    for share in shares:
        tally = share.tally
        label = "" if share.name == "state.jsonl" else f" [{share.name}]"
        lines.append(f"farm {directory}{label}: {_how(share, now)}")
        head = f"  {counts_words(tally, running=True)}"
        if tally.retried:
            head += f"; {tally.retried} attempt(s) retried"
        if tally.halted and share.live:
            head += f"; halted ({tally.halted}): no more tasks start"
        left = eta(tally, now) if share.live else None
        if left is not None and tally.not_run + tally.now_running:
            head += f"; ETA {duration(left)} ({_eta_basis(tally, now)})"
        lines.append(head)
        for gpu, (index, history) in sorted(tally.packing.items(), key=lambda p: p[1][0]):
            if gpu in tally.auto:  # a K given is the command line's
                lines.append(f"  K on gpu {index}: {k_path(history)}")
        for task in sorted(tally.running.values(), key=lambda t: t.since):
            lines.append(
                f"  running: task {task.task} (line {task.line}) on gpu {task.gpu_index}"
                f"{' of ' + task.node if task.node != share.node else ''}, attempt "
                f"{task.attempt}, since {_clock(task.since)} ({duration(now - task.since)})"
            )
        lines += [f"  failed: {failure_words(r)}" for r in tally.failures()]
    return lines


def failed_lines(totals: TaskTotals) -> list[str]:
    """``farm status --failed``: each failed task of the directory, one a line."""
    return [failure_words(r) for r in sorted(totals[1], key=lambda r: r.task)]


def _eta_basis(tally: Tally, now: float) -> str:
    mean = tally.busy / tally.attempts if tally.attempts else 0.0
    basis = f"mean {mean:.1f} s of {tally.attempts} attempt(s)" if tally.attempts else ""
    return f"{basis or 'no attempt finished yet'}, {tally.slots} at once"


def status_json(
    directory: str, shares: Sequence[ShareStatus], totals: TaskTotals, now: float
) -> dict[str, Any]:
    """What ``mpswrap farm status --json`` prints for one directory: its tasks, each once
    (``totals``), and each farm (``shares``)."""
    farms = [_share_json(s, now) for s in shares]
    keys = (
        "tasks",
        "done",
        "failed",
        "oom",
        "interrupted",
        "running",
        "ending",
        "not_run",
        "done_before",
        "failed_before",
    )
    counts = {k: totals[0][k] for k in keys}
    packing = {gpu: k for f in farms for gpu, k in f["packing"].items()}
    return {
        "directory": directory,
        "time": now,
        **counts,
        "packing": packing,
        "eta_rule": ETA_RULE,
        "shares": farms,
    }


def _share_json(share: ShareStatus, now: float) -> dict[str, Any]:
    tally, head = share.tally, share.tally.head
    return {
        "state_file": share.name,
        "state": share.state,
        "told": share.told,
        "node": share.node,
        "pid": head.get("pid", 0),
        "job": head.get("job"),
        "started": tally.started or None,
        "ended": tally.ended,
        "exit_code": tally.code,
        "halted": tally.halted or None,
        "tasks": tally.total + tally.done_before + tally.failed_before,
        "done": tally.done,
        "failed": tally.failed,
        "oom": tally.statuses["oom"],
        "interrupted": tally.interrupted,
        "running": tally.now_running,
        "ending": len(tally.settling),
        "not_run": tally.not_run - tally.interrupted,
        "done_before": tally.done_before,
        "failed_before": tally.failed_before,
        "retried": tally.retried,
        "mean_attempt_s": tally.busy / tally.attempts if tally.attempts else None,
        "places": tally.slots,
        "packing": {
            gpu: {"k": history[-1].k, "history": [c.to_json() for c in history]}
            for gpu, (_, history) in tally.packing.items()
            if history
        },
        "eta_s": eta(tally, now) if share.live else None,
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
            for t in sorted(tally.running.values(), key=lambda t: t.since)
        ],
        "failed_tasks": [
            {
                "task": r.task,
                "status": r.status,
                "code": r.code,
                "attempt": r.attempt,
                "log": r.stderr,
                "command": r.command,
            }
            for r in tally.failures()
        ],
    }
