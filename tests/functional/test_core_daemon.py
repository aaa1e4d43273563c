"""Issue-2 behaviours of `mpswrap start|status|stop` against the MPS simulator."""

from __future__ import annotations

import json
import os
import pwd
import re
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.simenv import SimNode
from tests.users import ensure_test_user

pytestmark = pytest.mark.functional
JOB = ["--job", "j1", "--node", "n1"]


@pytest.fixture
def user() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a non-root test user")
    return ensure_test_user()


def _gpus(node: SimNode) -> list[dict[str, Any]]:
    gpus: list[dict[str, Any]] = json.loads(node.inventory.read_text())["gpus"]
    return gpus


def _start(node: SimNode, *args: str, user: str | None = None) -> list[dict[str, Any]]:
    res = node.mpswrap("start", *JOB, "--json", *args, user=user)
    assert res.returncode == 0, res.stderr
    manifests: list[dict[str, Any]] = json.loads(res.stdout)
    return manifests


def _status(node: SimNode, user: str | None = None) -> dict[str, Any]:
    res = node.mpswrap("status", "--json", *JOB, user=user)
    assert res.returncode == 0, res.stderr
    jobs: list[dict[str, Any]] = json.loads(res.stdout)["jobs"]  # --job: at most one
    assert len(jobs) <= 1, jobs
    return jobs[0] if jobs else {"gpus": []}


def test_start_is_idempotent_and_two_gpus_get_two_private_daemons(node: SimNode, user: str) -> None:
    first = _start(node, user=user)
    again = _start(node, user=user)
    assert [m["daemon_pid"] for m in first] == [m["daemon_pid"] for m in again]
    assert len({m["daemon_pid"] for m in first}) == 2
    uid = pwd.getpwnam(user).pw_uid
    job = node.layout("j1", admin=False).job_dir
    for m in first:
        assert psutil.Process(m["daemon_pid"]).uids().real == uid
        for sub in ("", "pipe", "log"):
            path = job / str(m["key"]) / sub
            st = path.stat()
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid, 0o700), path
    assert [m["gpu_uuid"] for m in first] == [g["uuid"] for g in _gpus(node)]
    stopped = node.mpswrap("stop", *JOB, user=user)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not job.exists()


def test_daemon_cpus_are_gpu_local_cpus_intersected_with_allowed(node: SimNode) -> None:
    """The fake inventory gives each GPU half of the CPUs (cpu 0 and 1 on a 2-core machine)."""
    allowed = sorted(os.sched_getaffinity(0))
    local = {g["uuid"]: _cpu_list(str(g["cpus"])) for g in _gpus(node)}
    assert len(allowed) >= 2 and len({tuple(c) for c in local.values()}) == 2, local
    for cpus in (allowed, allowed[:1]):
        manifests = _start(node, "--cpus", ",".join(map(str, cpus)))
        for m in manifests:
            # local ∩ allowed; all allowed CPUs when the GPU's local ones are all outside
            expected = sorted(set(local[m["gpu_uuid"]]) & set(cpus)) or cpus
            assert m["cpus"] == expected, (m, local)
            assert sorted(psutil.Process(m["daemon_pid"]).cpu_affinity()) == expected
        assert node.mpswrap("stop", *JOB).returncode == 0


def _cpu_list(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def test_defaults_are_in_place_before_the_first_client(node: SimNode) -> None:
    _start(node, "--gpus", "0", "--threads", "25", "--prestart")
    status = _status(node)
    gpu = status["gpus"][0]
    assert gpu["default_active_thread_percentage"] == 25.0
    assert gpu["servers"][0]["active_thread_percentage"] == 25.0
    assert gpu["servers"][0]["clients"] == []
    node.mpswrap("stop", *JOB)


def test_stop_terminates_every_client_before_quit_and_leaves_nothing(node: SimNode) -> None:
    manifests = _start(node)
    layout = node.layout("j1")
    clients = []
    for m in manifests:
        dirs = layout.gpu(str(m["key"]))
        env = node.env(
            CUDA_MPS_PIPE_DIRECTORY=str(dirs.pipe),
            CUDA_MPS_LOG_DIRECTORY=str(dirs.log),
            CUDA_VISIBLE_DEVICES=str(m["gpu_uuid"]),
        )
        clients += [
            subprocess.Popen(
                [node.client, "--seconds", "60"],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for _ in range(2)
        ]
    _wait(lambda: sum(len(s["clients"]) for g in _status(node)["gpus"] for s in g["servers"]) == 4)
    logs = [layout.gpu(str(m["key"])).server_log for m in manifests]
    stopped = node.mpswrap("stop", *JOB)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert stopped.stdout.count("terminated 2 client(s), killed 0") == 2, stopped.stdout
    assert stopped.stdout.count("2 client termination(s) succeeded, 0 fatal") == 2
    outs = [c.communicate(timeout=30)[0] for c in clients]
    assert all("810" in o for o in outs), outs
    assert not layout.job_dir.exists()
    assert not any(p.exists() for p in logs)
    again = node.mpswrap("stop", *JOB)
    assert again.returncode == 0 and "nothing to stop" in again.stdout


def test_a_hung_daemon_is_cleaned_up_within_the_bound(node: SimNode) -> None:
    manifests = _start(node, "--gpus", "0")
    node.faults.write_text(json.dumps({"hang": ["*"]}))
    t0 = time.monotonic()
    stopped = node.mpswrap("stop", *JOB)
    took = time.monotonic() - t0
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert (
        not psutil.pid_exists(int(manifests[0]["daemon_pid"]))
        or psutil.Process(int(manifests[0]["daemon_pid"])).status() == psutil.STATUS_ZOMBIE
    )
    assert took < 30, took  # command timeouts (3 s) + quit (2 s) + kill, not forever


def test_status_reports_faults_from_server_log(node: SimNode) -> None:
    m = _start(node, "--gpus", "0")[0]
    dirs = node.layout("j1").gpu(str(m["key"]))
    env = node.env(CUDA_MPS_PIPE_DIRECTORY=str(dirs.pipe), CUDA_MPS_LOG_DIRECTORY=str(dirs.log))
    victim = subprocess.Popen([node.client, "--seconds", "30"], env=env, stdout=subprocess.DEVNULL)
    _wait(lambda: bool(_status(node)["gpus"][0]["servers"]))
    culprit = subprocess.run(
        [node.client, "--seconds", "10", "--fault-after", "0.5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert culprit.returncode != 0
    victim.wait(timeout=30)
    faults = _status(node)["gpus"][0]["faults"]
    assert faults and named_in_fault(faults, victim.pid)
    # every affected client has exited: the server takes clients again
    _wait(lambda: _status(node)["gpus"][0]["faults"][-1]["recovered"])
    node.mpswrap("stop", *JOB)


def named_in_fault(faults: list[dict[str, object]], pid: int) -> bool:
    return any(pid in f["affected"] or pid in f["reported_by"] for f in faults)  # type: ignore[operator]


def _wait(cond: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


# --- bad input: one line, a hint where the user can act, and nothing left ---------------
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["start", "--gpus", "7"], {}, r"no such GPU \(index 7\): this node has 2 GPU\(s\)"),
        (["start", "--gpus", "GPU-zzz"], {}, "argument --gpus: invalid value 'GPU-zzz'"),
        (["start", "--gpus", "0-"], {}, "argument --gpus: invalid value '0-'"),
        (["start", "--job", "../x"], {}, "argument --job: invalid value"),
        (["start", "--job", "a/b"], {}, "argument --job: invalid value"),
        (
            ["start"],
            {"MPSWRAP_USER_RUN_DIR": "/tmp/" + "x" * 90, "MPSWRAP_RUN_DIR": "/tmp/" + "x" * 90},
            "too long for MPS sockets",
        ),
        (
            ["start"],
            {"MPSWRAP_CONTROL_BINARY": "/nonexistent/nvidia-cuda-mps-control"},
            "MPS control program not found",
        ),
        (
            ["start"],
            {"MPSWRAP_USER_RUN_DIR": "/proc/mpswrap", "MPSWRAP_RUN_DIR": "/proc/mpswrap"},
            "(run directory not writable|cannot create (the run )?directory)",
        ),
        (["status"], {"MPSWRAP_QUIT_TIMEOUT": "-1"}, "bad value for quit_timeout"),
    ],
)
def test_bad_input_gives_one_line_and_leaves_nothing(
    node: SimNode, args: list[str], env: dict[str, str], message: str
) -> None:
    cmd = [*args] if "--job" in args else [*args, *JOB]
    res = node.mpswrap(*cmd, **env)  # type: ignore[arg-type]
    assert res.returncode in (1, 2), res
    lines = [ln for ln in res.stderr.splitlines() if not ln.startswith("hint:")]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("mpswrap: "), res.stderr
    assert re.search(message, lines[0]), res.stderr
    assert not node.layout("j1", admin=False).job_dir.exists()
    assert not node.layout("j1", admin=True).job_dir.exists()


def test_each_gpu_keeps_its_own_daemon_whatever_order_a_job_starts_them(node: SimNode) -> None:
    """``start --gpus 0`` then ``start --gpus 1`` in one job: the second GPU gets a daemon of
    its own (key ``g1``), not the first GPU's at ``g0``; a third start of either finds its
    own GPU's daemon."""
    gpus = [g["uuid"] for g in _gpus(node)]
    (first,) = _start(node, "--gpus", "0")
    (second,) = _start(node, "--gpus", "1")
    assert (first["key"], first["gpu_uuid"]) == ("g0", gpus[0])
    assert (second["key"], second["gpu_uuid"]) == ("g1", gpus[1])
    assert first["daemon_pid"] != second["daemon_pid"]
    (again,) = _start(node, "--gpus", "1")
    assert (again["key"], again["daemon_pid"]) == ("g1", second["daemon_pid"])
    both = _start(node)
    assert [(m["key"], m["gpu_uuid"]) for m in both] == [("g0", gpus[0]), ("g1", gpus[1])]
    assert node.mpswrap("stop", *JOB).returncode == 0


def test_ranks_of_one_job_on_different_gpus_each_get_their_gpus_daemon(node: SimNode) -> None:
    """Per-rank mode without a prolog, one GPU a task (``srun --gpus-per-task=1 mpswrap
    ./app``): each rank's pipe directory is its own GPU's daemon's, overlapping or not."""
    gpus = [g["uuid"] for g in _gpus(node)]
    seen = node.root / "seen"
    seen.mkdir()
    program = (
        f'echo "$CUDA_VISIBLE_DEVICES $CUDA_MPS_PIPE_DIRECTORY" > {seen}/$R; '
        f'cp "$(dirname "$CUDA_MPS_PIPE_DIRECTORY")/manifest.json" {seen}/$R.json; sleep 2'
    )
    procs = [
        node.start(
            "--job", "pertask", "--", "sh", "-c", program, CUDA_VISIBLE_DEVICES=str(i), R=str(i)
        )
        for i in (1, 0)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    for i in (0, 1):
        cvd, pipe = (seen / str(i)).read_text().split()
        manifest = json.loads((seen / f"{i}.json").read_text())
        assert cvd == manifest["gpu_uuid"] == gpus[i], (i, cvd, pipe, manifest)
        assert Path(pipe).parent.name == manifest["key"], (pipe, manifest)


def test_a_gpu_directory_holding_another_gpus_daemon_is_refused(node: SimNode) -> None:
    """The last word, whatever chose the key: a running daemon of another GPU is never
    handed out (its clients would run on that GPU)."""
    from mpswrap._proc import lookup_user
    from mpswrap.config import load_settings
    from mpswrap.errors import DaemonError
    from mpswrap.job.job import JobDaemons
    from mpswrap.mps.gpu import load_inventory
    from mpswrap.mps.start import Defaults

    (first,) = _start(node, "--gpus", "0")
    settings = load_settings(env=node.env())
    daemons = JobDaemons(node.layout("j1"), settings)
    other = load_inventory(str(node.inventory)).gpus[1]
    with pytest.raises(DaemonError, match="another GPU's daemon") as raised:
        daemons.start(
            [other],
            lookup_user(),
            started_by="cli",
            defaults=Defaults.from_settings(settings),
            shared_parents=os.geteuid() == 0,  # as start makes them
            keys=["g0"],
        )
    assert first["gpu_uuid"] in raised.value.line()
    assert node.mpswrap("stop", *JOB).returncode == 0


def test_stop_json_says_what_each_gpus_ladder_did(node: SimNode) -> None:
    _start(node)
    res = node.mpswrap("stop", *JOB, "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["clean"] is True and report["node"] == "n1"
    (job,) = report["jobs"]
    assert job["job"] == "j1" and job["clean"] is True and job["left"] == []
    assert [g["key"] for g in job["gpus"]] == ["g0", "g1"]
    assert all(g["ended_by_terminate_client"] == [] and g["leftovers"] == [] for g in job["gpus"])
    again = node.mpswrap("stop", *JOB, "--json")
    assert (again.returncode, json.loads(again.stdout)) == (
        0,
        {"node": "n1", "jobs": [], "clean": True},
    )
