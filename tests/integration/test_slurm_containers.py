"""A container as a plain ``srun`` task under mpswrap's Slurm hooks (22.05, the MPS simulator):
the task runs ``bwrap`` (own mount, PID and IPC namespaces, as Apptainer sets a container up)
with ``mpswrap container-args bwrap``'s flags, asked inside the task, where the task prolog's
variables name the job's daemons. The job's run directory is hidden in the container but for
that bind. Each client attaches to its GPU's daemon, which knows it by its host PID, not the
PID it has inside; the epilog ends the job and leaves nothing (the conftest checks).
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest

from tests.integration.harness import Cluster, read_records, why_not_runnable

_skip = why_not_runnable()
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(_skip is not None, reason=_skip or ""),
]


def test_plain_srun_bwrap_tasks_attach_with_container_args(cluster: Cluster, workdir: Path) -> None:
    bwrap = shutil.which("bwrap")
    assert bwrap, "bubblewrap (Debian's bwrap) is part of the test machine (tools/test.sh)"
    rec = workdir / "clients.jsonl"
    client = shlex.join(cluster.client_argv(rec, seconds=1))
    hidden = shlex.quote(str(cluster.run_dir))
    # The container's root is the host's, read-only; the run directory is an empty tmpfs in
    # it, and only container-args' bind brings the job's directory back.
    task = (
        f"exec {bwrap} --ro-bind / / --dev-bind /dev /dev --proc /proc --tmpfs {hidden}"
        f" $({shlex.quote(cluster.python)} -m mpswrap container-args bwrap)"
        f" --bind {workdir} {workdir} --unshare-pid --unshare-ipc --die-with-parent -- {client}"
    )
    opts = ["-w", "node1", "-N1", "-n2", "--gres=gpu:1", "--comment=mps"]
    job = cluster.srun(*opts, "sh", "-c", task, cwd=workdir)
    assert job.proc is not None and job.proc.returncode == 0, job.output
    starts = read_records(rec)
    assert len(starts) == 2, (starts, job.output)
    pipe = cluster.pipe("node1", job.id, 0)
    for start in starts:
        assert start["mode"] == "mps" and start["pipe"] == pipe, start
        assert start["ns_pid"] != start["pid"], start  # listed by the PID the host gives it
