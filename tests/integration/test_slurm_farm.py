"""``mpswrap farm`` across nodes under a real Slurm (the harness of test_slurm_hooks.py): in a
2-node batch job, ``srun --ntasks-per-node=1 mpswrap farm TASKS`` gives each node a disjoint
share of the tasks, which it packs onto the prolog's daemons of its own GPUs."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from tests.integration.harness import Cluster, read_records, why_not_runnable

_skip = why_not_runnable()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(_skip is not None, reason=_skip or "")]


def test_srun_farm_on_two_nodes_splits_the_tasks_and_packs_each_share_on_its_node(
    cluster: Cluster, workdir: Path
) -> None:
    rec, farm_dir = workdir / "clients.jsonl", workdir / "farm"
    tasks = workdir / "tasks.txt"
    line = f'{cluster.sim.client} --seconds 1 --record {rec} --tag "$MPSWRAP_TASK"'
    tasks.write_text("".join(f"{line}\n" for _ in range(12)))
    script = f"""#!/bin/sh
export MPSWRAP_CONFIG={cluster.config_path}
srun --ntasks-per-node=1 {cluster.python} -m mpswrap farm --per-gpu 2 --progress lines \\
  --dir {farm_dir} {tasks}
echo "srun=$?"
"""
    opts = ["-N2", "--ntasks-per-node=1", "--gres=gpu:2", "--comment=mps"]
    job_id = cluster.sbatch(script, *opts, cwd=workdir)
    state = cluster.wait_gone(job_id)
    out = (workdir / f"slurm-{job_id}.out").read_text()
    assert state == "COMPLETED" and "srun=0" in out, out
    starts = read_records(rec)
    assert sorted(int(s["tag"]) for s in starts) == list(range(12)), out
    # Each task on a GPU of the node that ran its share, through that GPU's prolog daemon.
    pipes = {cluster.pipe(n, job_id, k): (n, k) for n in ("node1", "node2") for k in (0, 1)}
    on: dict[str, set[int]] = defaultdict(set)
    for s in starts:
        assert s["mode"] == "mps" and s["pipe"] in pipes, s
        node, position = pipes[s["pipe"]]
        assert s["cvd"] == cluster.gpu_uuid(node, position), s
        on[node].add(int(s["tag"]))
    shares = sorted(on.values(), key=min)
    assert shares == [set(range(0, 12, 2)), set(range(1, 12, 2))], on
    assert {
        len({pipes[s["pipe"]][1] for s in starts if int(s["tag"]) in share}) for share in shares
    } == {2}, "each node used both its GPUs"
    records = {  # the finished attempts, not the farm's events
        p.name: [r for r in map(json.loads, p.read_text().splitlines()) if "event" not in r]
        for p in farm_dir.glob("state*.jsonl")
    }
    assert sorted(records) == ["state-0of2.jsonl", "state-1of2.jsonl"], records
    assert all(len(r) == 6 and all(x["status"] == "done" for x in r) for r in records.values())
    assert out.count("6 done, 0 failed, 0 not run") == 2, out
