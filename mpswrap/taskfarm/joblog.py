"""The farm's attempts in GNU parallel's ``--joblog`` format, beside the journal, so that the
tools people already point at a joblog (awk, parallel's own scripts) read a farm's.

Tab-separated, a header line, then one line per task once it is settled: its last attempt
(as ``parallel --retries`` writes one line per job, not per try; the journal has every
attempt). A task a signal or ``--halt now`` interrupted is not settled: it has no line, and
runs again on resume (parallel's ``--resume`` would take a line as done)::

    Seq  Host  Starttime  JobRuntime  Send  Receive  Exitval  Signal  Command

``Seq`` is the task's number from 1 (parallel's ``{#}``; ``MPSWRAP_TASK`` + 1), ``Host`` the
node, ``Starttime`` seconds since the epoch and ``JobRuntime`` seconds (three decimals),
``Send`` and ``Receive`` 0 (nothing is transferred), ``Exitval`` the task's exit code, shell
style (128+N after signal N, so that ``$7 != 0`` finds every failure), ``Signal`` the signal
that ended it (0 if it exited; 15 for a ``--timeout``), ``Command`` its line with tabs and
newlines as spaces. The journal (``journal``) stays the farm's record: the joblog is written
from the same records and read by nobody in mpswrap.
"""

from __future__ import annotations

import os
from pathlib import Path

from .journal import TIMEOUT, TaskRecord

__all__ = ["HEADER", "Joblog", "joblog_line"]

HEADER = "Seq\tHost\tStarttime\tJobRuntime\tSend\tReceive\tExitval\tSignal\tCommand\n"


def joblog_line(record: TaskRecord) -> str:
    command = " ".join(record.command.split())
    # Past --timeout, 15 whatever ended it: a CUDA task's terminate_client comes first, and
    # it exits on its own (1, error 810) before any signal reaches it.
    signal = record.signal or (15 if record.status == TIMEOUT else 0)
    return (
        f"{record.task + 1}\t{record.node or ':'}\t{record.start:.3f}\t{record.seconds:.3f}"
        f"\t0\t0\t{record.code}\t{signal}\t{command}\n"
    )


class Joblog:
    """The joblog of one share, opened for appending; its header written once."""

    def __init__(self, path: Path) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        self.fd = os.open(path, flags, 0o644)
        if os.fstat(self.fd).st_size == 0:
            os.write(self.fd, HEADER.encode())

    def add(self, record: TaskRecord) -> None:
        os.write(self.fd, joblog_line(record).encode())

    def close(self) -> None:
        os.close(self.fd)
