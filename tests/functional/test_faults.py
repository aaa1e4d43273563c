"""Faults: what mpswrap does when ranks, daemons, hooks or the node misbehave (simulator).

Each test names the fault, injects it for real (signals to real processes, the simulator's
MPSWRAP_SIM_FAULTS file, forged manifests, concurrent starts), and asserts the effect on
processes by PID, files and exit codes; docs/reliability.md lists them as the fault matrix.
The hooks run as ``python -m mpswrap prolog|epilog`` with a fake Slurm job environment and an
admin file (MPSWRAP_CONFIG), as slurmd would run them.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.procs import described
from tests.simenv import SimNode, sim_node
from tests.tree import REPO
from tests.users import TEST_USER, ensure_test_user, spawn_as, user_argv
from tests.waits import wait_until

pytestmark = pytest.mark.functional
JOB = ("--job", "j1", "--node", "n1")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root")
UUID0 = "GPU-5a1d0000-0000-4000-8000-000000000000"
UUID1 = "GPU-5a1d0001-0000-4000-8000-000000000001"


# --- helpers shared with test_security.py ---------------------------------------------------
def admin_config(node: SimNode, **extra: str) -> Path:
    """The admin file a site would write, pointing at the simulated node."""
    lines = {
        "run_dir": str(node.run_dir),
        "user_run_dir": str(node.user_run_dir),
        "control_binary": node.control,
        "gpu_inventory": str(node.inventory),
        "prolog_mode": "always",
        "syslog": "no",
        "start_timeout": "10",
        "command_timeout": "3",
        "terminate_timeout": "3",
        "quit_timeout": "2",
        **extra,
    }
    path = node.root / "mpswrap.conf"
    path.write_text("".join(f"{k} = {v}\n" for k, v in lines.items()))
    path.chmod(0o644)
    return path


def slurm_hook(
    node: SimNode,
    hook: str,
    *,
    job: str = "101",
    user: str | None = None,
    gpus: str = "0,1",
    timeout: float = 120,
    python: str = sys.executable,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """Run a Slurm hook as root for a job of ``user`` (default: the test user), with
    ``python``."""
    entry = pwd.getpwnam(user or ensure_test_user())
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MPSWRAP_", "SLURM", "CUDA"))}
    if not (node.root / "mpswrap.conf").exists():
        admin_config(node)
    base.update(
        MPSWRAP_CONFIG=str(node.root / "mpswrap.conf"),
        SLURM_JOB_ID=job,
        SLURM_JOB_UID=str(entry.pw_uid),
        SLURM_JOB_GID=str(entry.pw_gid),
        SLURM_JOB_USER=entry.pw_name,
        SLURMD_NODENAME="n1",
        SLURM_JOB_GPUS=gpus,
        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="100",
        SLURM_CONF=str(node.root / "slurm.conf"),  # no gres.conf: positions by minor number
        PYTHONPATH=str(REPO),  # this tree's mpswrap, whatever the working directory
    )
    base.update(env)  # MPSWRAP_CONFIG too
    return subprocess.run(
        [python, "-m", "mpswrap", hook],
        env=base,
        text=True,
        capture_output=True,
        timeout=timeout,
    )


def admin_job(node: SimNode, job: str = "101") -> Path:
    return node.layout(job, admin=True).job_dir


def take_over_socket(node: SimNode, job: str, socket: Path, key: str = "g0") -> None:
    """Make the socket the job's user put at ``socket`` the one root's commands reach: what
    a job user who took over the daemon's own listener (same-uid ptrace of the daemon, where
    the kernel allows it) gets. Root pins the daemon's socket when it starts, and no socket
    the job user swaps into the pipe directory later is ever reached (docs/security.md):
    the tests of hostile replies repoint root's pin and record as that takeover would."""
    record = node.run_dir / ".locks" / f"n1.{job}.{key}.held.json"
    data = json.loads(record.read_text())
    pinned = node.run_dir / ".control" / data["pin"] / "control"
    fresh = pinned.with_name(".control.new")
    os.link(socket, fresh, follow_symlinks=False)
    os.replace(fresh, pinned)
    st = os.lstat(pinned)
    data["socket"] = [st.st_dev, st.st_ino]
    fresh = record.with_name(".held.new")
    fresh.write_text(json.dumps(data))
    fresh.chmod(0o600)
    os.replace(fresh, record)


def manifests(job_dir: Path) -> dict[str, dict[str, Any]]:
    return {
        p.parent.name: json.loads(p.read_text()) for p in sorted(job_dir.glob("g*/manifest.json"))
    }


def daemons_of(pipe: Path) -> list[psutil.Process]:
    """Simulated control daemons serving ``pipe`` (found by their environment, not name)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "mpswrap.sim.control" not in " ".join(proc.info["cmdline"] or ()):
                continue
            env = proc.environ()
            if env.get("CUDA_MPS_PIPE_DIRECTORY") == str(pipe) and proc.status() != "zombie":
                found.append(proc)
        except psutil.Error:
            continue
    return found


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# --- fixtures -------------------------------------------------------------------------------


def job_dir(node: SimNode) -> Path:
    """Where `mpswrap start` puts job j1: run_dir as root (admin mode), else user_run_dir."""
    return node.layout("j1").job_dir


def start(node: SimNode, *args: str) -> list[dict[str, Any]]:
    res = node.mpswrap("start", *JOB, "--json", *args)
    assert res.returncode == 0, res.stderr
    started: list[dict[str, Any]] = json.loads(res.stdout)
    return started


def stop(node: SimNode, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return node.mpswrap("stop", *JOB, timeout=timeout)


def client(
    node: SimNode, procs: list[subprocess.Popen[str]], key: str, *args: str
) -> subprocess.Popen[str]:
    dirs = node.layout("j1").gpu(key)
    env = node.env(
        CUDA_MPS_PIPE_DIRECTORY=str(dirs.pipe),
        CUDA_MPS_LOG_DIRECTORY=str(dirs.log),
        CUDA_VISIBLE_DEVICES=str(manifests(job_dir(node))[key]["gpu_uuid"]),
    )
    proc = subprocess.Popen(
        [node.client, *args], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    procs.append(proc)
    return proc


def clients_listed(node: SimNode) -> list[int]:
    res = node.mpswrap("status", "--json", *JOB)
    assert res.returncode == 0, res.stderr
    jobs = json.loads(res.stdout)["jobs"]
    return [c["pid"] for j in jobs for g in j["gpus"] for s in g["servers"] for c in s["clients"]]


def assert_nothing_left(node: SimNode, where: Path) -> None:
    assert not where.exists(), sorted(str(p) for p in where.rglob("*"))
    assert not node.leftovers(), [described(p) for p in node.leftovers()]


# --- ranks ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV], ids=["SIGKILL", "SIGSEGV"])
def test_a_rank_killed_mid_run_leaves_the_daemon_serving_and_stop_leaves_nothing(
    node: SimNode, procs: list[subprocess.Popen[str]], sig: int
) -> None:
    m = start(node, "--gpus", "0")[0]
    victim = client(node, procs, "g0", "--seconds", "120")
    other = client(node, procs, "g0", "--seconds", "120")
    wait_until(
        lambda: sorted(clients_listed(node)) == sorted([victim.pid, other.pid]), 60, "2 clients"
    )
    os.kill(victim.pid, sig)
    victim.communicate(timeout=30)
    assert victim.returncode == -sig
    # The daemon notices the client is gone and keeps serving the other one.
    wait_until(lambda: clients_listed(node) == [other.pid], 60, "the killed client to drop out")
    assert not gone(int(m["daemon_pid"]))
    res = stop(node)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "g0: terminated 1 client(s), killed 0" in res.stdout, res.stdout
    out, _ = other.communicate(timeout=30)
    assert "CUDA error 810" in out, out
    assert gone(int(m["daemon_pid"]))
    assert_nothing_left(node, job_dir(node))


# --- the control daemon dies ----------------------------------------------------------------
def test_daemon_killed_mid_job_stop_kills_its_orphaned_server_by_manifest_identity(
    node: SimNode,
) -> None:
    m = start(node, "--gpus", "0", "--prestart")[0]
    server = int(m["servers"][0]["pid"])
    os.kill(int(m["daemon_pid"]), signal.SIGKILL)
    wait_until(lambda: gone(int(m["daemon_pid"])), 60, "the daemon to die")
    assert not gone(server)  # a real server outlives its daemon too
    res = stop(node)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"forced daemon/server [{server}]" in res.stdout, res.stdout
    assert gone(server)
    assert_nothing_left(node, job_dir(node))


def test_daemon_killed_after_a_client_started_its_server_stop_still_ends_the_server(
    node: SimNode, procs: list[subprocess.Popen[str]]
) -> None:
    # The server starts with the first client, after the manifest was written: the manifest
    # cannot name it. control.log does ("Starting new server <pid>"), and the server's
    # environment names this job's pipe directory.
    m = start(node, "--gpus", "0")[0]
    rank = client(node, procs, "g0", "--seconds", "3")
    wait_until(lambda: clients_listed(node) == [rank.pid], 60, "the client to attach")
    os.kill(int(m["daemon_pid"]), signal.SIGKILL)
    out, _ = rank.communicate(timeout=60)
    assert "mode=mps" in out and "done" in out, out
    orphans = [p.pid for p in node.leftovers()]
    assert orphans, "the orphaned server should still run"
    res = stop(node)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "LEFT BEHIND" not in res.stdout
    assert all(gone(pid) for pid in orphans)
    assert_nothing_left(node, job_dir(node))


def _user_start(node: SimNode) -> dict[str, Any]:
    """``mpswrap start`` of job j1 on GPU 0, prestarted, as the test user: a user-mode daemon
    of the user's own, which the user's own ``stop`` reads the manifest of."""
    res = node.mpswrap("start", *JOB, "--json", "--gpus", "0", "--prestart", user=TEST_USER)
    assert res.returncode == 0, res.stderr
    started: list[dict[str, Any]] = json.loads(res.stdout)
    return started[0]


def _user_client(node: SimNode, procs: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    """A client of the test user's j1 daemon on g0, as that user (its PID is the client's)."""
    dirs = node.layout("j1", admin=False).gpu("g0")
    proc = spawn_as(
        TEST_USER,
        [node.client, "--seconds", "120"],
        CUDA_MPS_PIPE_DIRECTORY=str(dirs.pipe),
        CUDA_MPS_LOG_DIRECTORY=str(dirs.log),
    )
    procs.append(proc)
    return proc


def _user_listed(node: SimNode) -> list[int]:
    res = node.mpswrap("status", "--json", *JOB, user=TEST_USER)
    jobs = json.loads(res.stdout)["jobs"] if res.stdout else []
    return [c["pid"] for j in jobs for g in j["gpus"] for s in g["servers"] for c in s["clients"]]


def test_daemon_killed_with_a_rank_still_running_stop_ends_it_by_signal(
    node: SimNode, procs: list[subprocess.Popen[str]]
) -> None:
    """User mode: nobody is left to terminate_client the rank once its daemon died. Once its
    server is gone (so nothing can wedge), the user's own process whose pipe directory is the
    job's is ended by signal, as Slurm ends a job's processes, and counted as killed: nothing
    survives, exit 0."""
    m = _user_start(node)
    rank = _user_client(node, procs)
    wait_until(lambda: _user_listed(node) == [rank.pid], 60, "the client to attach")
    os.kill(int(m["daemon_pid"]), signal.SIGKILL)
    res = node.mpswrap("stop", *JOB, user=TEST_USER)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(rf"ending {rank.pid} \(.*mpswrap\.sim\.client", res.stderr), res.stderr
    assert rank.wait(timeout=30) == -signal.SIGTERM
    assert gone(int(m["servers"][0]["pid"]))
    assert_nothing_left(node, node.layout("j1", admin=False).job_dir)


def test_a_daemon_that_hangs_on_every_command_is_cleaned_up_within_the_bounds(
    node: SimNode, procs: list[subprocess.Popen[str]]
) -> None:
    """User mode: a daemon that answers nothing. Each command is bounded (3 s, quit 2 s + 3),
    then the daemon and its server are ended by signal, and the client nobody could
    terminate_client once its server is gone."""
    m = _user_start(node)
    rank = _user_client(node, procs)
    wait_until(lambda: _user_listed(node) == [rank.pid], 60, "the client to attach")
    node.faults.write_text(json.dumps({"hang": ["*"]}))
    # Bounded: a generous ceiling, not a timing.
    res = node.mpswrap("stop", *JOB, user=TEST_USER, timeout=90)
    assert gone(int(m["daemon_pid"]))
    assert gone(int(m["servers"][0]["pid"]))
    assert "cannot list servers: timed out" in res.stdout, res.stdout
    assert "quit: timed out" in res.stdout, res.stdout
    assert res.returncode == 0 and f"ending {rank.pid} " in res.stderr, res.stdout + res.stderr
    assert rank.wait(timeout=30) == -signal.SIGTERM
    assert_nothing_left(node, node.layout("j1", admin=False).job_dir)


def test_a_daemon_that_hangs_is_ended_by_roots_record_within_the_deadline(
    node: SimNode,
) -> None:
    """As root, a daemon that answers nothing is ended through root's record and cgroup
    within ``teardown_deadline``: the commands each take their share, then its cgroup goes."""
    m = start(node, "--gpus", "0", "--prestart")[0]
    node.faults.write_text(json.dumps({"hang": ["*"]}))
    took = time.monotonic()
    res = node.mpswrap("stop", *JOB, timeout=90, MPSWRAP_TEARDOWN_DEADLINE="6")
    assert time.monotonic() - took < 6 + 10, res.stdout  # the deadline, and Python's starts
    assert res.returncode == 0, res.stdout + res.stderr
    assert gone(int(m["daemon_pid"])) and gone(int(m["servers"][0]["pid"]))
    assert_nothing_left(node, job_dir(node))


# --- hooks run again, or alone ----------------------------------------------------------------
@needs_root
def test_prolog_twice_is_idempotent_and_epilog_twice_is_a_silent_no_op(node: SimNode) -> None:
    first = slurm_hook(node, "prolog")
    assert first.returncode == 0, first.stderr
    before = manifests(admin_job(node))
    second = slurm_hook(node, "prolog")
    assert second.returncode == 0, second.stderr
    after = manifests(admin_job(node))
    assert sorted(before) == ["g0", "g1"]
    assert [m["daemon_pid"] for m in after.values()] == [m["daemon_pid"] for m in before.values()]
    for key in before:
        assert len(daemons_of(node.layout("101", admin=True).gpu(key).pipe)) == 1, key
    assert second.stderr.count("already running") == 2, second.stderr
    end = slurm_hook(node, "epilog")
    assert end.returncode == 0, end.stderr
    assert all(gone(int(m["daemon_pid"])) for m in before.values())
    assert_nothing_left(node, admin_job(node))
    again = slurm_hook(node, "epilog")
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")


@needs_root
def test_epilog_without_prolog_is_silent(node: SimNode) -> None:
    res = slurm_hook(node, "epilog")
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")
    assert not node.run_dir.exists()


@needs_root
def test_epilog_sweeps_user_mode_daemons_the_job_left(node: SimNode) -> None:
    user = ensure_test_user()
    admin_config(node)
    res = node.mpswrap("start", "--job", "101", "--node", "n1", "--json", user=user)
    assert res.returncode == 0, res.stderr
    pids = [m["daemon_pid"] for m in json.loads(res.stdout)]
    end = slurm_hook(node, "epilog")
    assert end.returncode == 0, end.stderr
    assert all(gone(pid) for pid in pids)
    assert_nothing_left(node, node.layout("101", admin=False).job_dir)


@needs_root
def test_a_corrupt_manifest_does_not_stop_the_epilog_from_tearing_down(node: SimNode) -> None:
    admin_config(node)
    assert slurm_hook(node, "prolog", gpus="0").returncode == 0
    pid = int(manifests(admin_job(node))["g0"]["daemon_pid"])
    node.layout("101", admin=True).gpu("g0").manifest.write_text('{"version": 1, "gpu_uu')  # torn
    res = slurm_hook(node, "epilog", gpus="0")
    # The daemon is still found (pid file + its environment) and torn down.
    assert gone(pid), res.stderr
    assert res.returncode == 0, res.stderr
    assert_nothing_left(node, admin_job(node))


@needs_root
@pytest.mark.parametrize("gone", [False, True], ids=["healthy", "gpu-gone"])
def test_the_epilog_health_check_runs_on_every_gpu_of_the_job(node: SimNode, gone: bool) -> None:
    admin_config(node, health_check="yes")
    assert slurm_hook(node, "prolog").returncode == 0
    if gone:  # GPU 1 fell off the bus during the job: the inventory no longer lists it
        inventory = json.loads(node.inventory.read_text())
        inventory["gpus"] = [g for g in inventory["gpus"] if g["uuid"] != UUID1]
        node.inventory.write_text(json.dumps(inventory))
    res = slurm_hook(node, "epilog")
    passed = re.findall(r"GPU (\S+) passed the health check", res.stderr)
    failed = re.findall(r"GPU (\S+) failed the health check", res.stderr)
    if gone:  # epilog_failure = drain (the default): a failed check fails the epilog
        assert (passed, failed, res.returncode) == ([UUID0], [UUID1], 1), res.stderr
    else:
        assert (passed, failed, res.returncode) == ([UUID0, UUID1], [], 0), res.stderr
    assert_nothing_left(node, admin_job(node))


# --- stale state ------------------------------------------------------------------------------
def _crash(node: SimNode) -> dict[str, Any]:
    """A job whose daemon died without teardown: dirs, manifest, pid file and sockets stay."""
    m = start(node, "--gpus", "0")[0]
    os.kill(int(m["daemon_pid"]), signal.SIGKILL)
    wait_until(lambda: gone(int(m["daemon_pid"])), 60, "the daemon to die")
    assert node.layout("j1").gpu("g0").manifest.exists()
    assert node.layout("j1").gpu("g0").pid_file.exists()
    return m


def test_stale_state_of_a_crashed_job_is_cleared_by_the_next_start(node: SimNode) -> None:
    old = _crash(node)
    new = start(node, "--gpus", "0")[0]
    assert new["daemon_pid"] != old["daemon_pid"]
    assert manifests(job_dir(node))["g0"]["daemon_pid"] == new["daemon_pid"]
    assert len(daemons_of(node.layout("j1").gpu("g0").pipe)) == 1
    assert stop(node).returncode == 0
    assert_nothing_left(node, job_dir(node))


def test_stale_state_of_a_crashed_job_is_cleared_by_stop(node: SimNode) -> None:
    _crash(node)
    res = stop(node)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "LEFT BEHIND" not in res.stdout
    assert_nothing_left(node, job_dir(node))


@pytest.mark.parametrize("then", ["stop", "start"])
def test_a_reused_daemon_pid_is_never_killed_and_the_stale_state_is_cleared(
    node: SimNode, procs: list[subprocess.Popen[str]], then: str
) -> None:
    _crash(node)
    unrelated = subprocess.Popen(["sleep", "60"], text=True)
    procs.append(unrelated)
    path = node.layout("j1").gpu("g0").manifest
    manifest = json.loads(path.read_text())
    manifest["daemon_pid"] = unrelated.pid  # the dead daemon's PID, now someone else's
    manifest["daemon_start_time"] = psutil.Process(unrelated.pid).create_time() - 1000.0
    path.write_text(json.dumps(manifest))
    if then == "start":
        new = start(node, "--gpus", "0")[0]
        assert new["daemon_pid"] != unrelated.pid
    res = stop(node)
    assert res.returncode == 0, res.stdout + res.stderr
    assert unrelated.poll() is None, "an unrelated process was signalled"
    assert psutil.Process(unrelated.pid).status() != psutil.STATUS_ZOMBIE
    assert_nothing_left(node, job_dir(node))


# --- concurrency ------------------------------------------------------------------------------
def _together(argvs: list[list[str]], envs: list[dict[str, str]]) -> list[tuple[int, str, str]]:
    started = [
        subprocess.Popen(a, env=e, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for a, e in zip(argvs, envs, strict=False)
    ]
    out = []
    for proc in started:
        stdout, stderr = proc.communicate(timeout=240)
        out.append((proc.returncode, stdout, stderr))
    return out


@needs_root
@pytest.mark.timeout(600)
def test_four_prologs_of_four_jobs_at_once_then_four_epilogs(node: SimNode) -> None:
    admin_config(node)
    jobs = ["201", "202", "203", "204"]

    def hooks(hook: str) -> list[tuple[int, str, str]]:
        # Through slurm_hook's environment, started together.
        argv = [sys.executable, "-m", "mpswrap", hook]
        envs = []
        for job in jobs:
            entry = pwd.getpwnam(ensure_test_user())
            env = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("MPSWRAP_", "SLURM", "CUDA"))
            }
            env.update(
                MPSWRAP_CONFIG=str(node.root / "mpswrap.conf"),
                SLURM_JOB_ID=job,
                SLURM_JOB_UID=str(entry.pw_uid),
                SLURM_JOB_GID=str(entry.pw_gid),
                SLURMD_NODENAME="n1",
                SLURM_JOB_GPUS="0,1",
                CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="100",
                SLURM_CONF=str(node.root / "slurm.conf"),
            )
            envs.append(env)
        return _together([argv] * len(jobs), envs)

    results = hooks("prolog")
    assert [r[0] for r in results] == [0] * 4, [r[2] for r in results]
    pids = [m["daemon_pid"] for job in jobs for m in manifests(admin_job(node, job)).values()]
    assert len(pids) == len(set(pids)) == 8
    assert all(not gone(int(p)) for p in pids)
    results = hooks("epilog")
    assert [r[0] for r in results] == [0] * 4, [r[2] for r in results]
    assert all(gone(int(p)) for p in pids)
    for job in jobs:
        assert not admin_job(node, job).exists()
    assert_nothing_left(node, node.run_dir / "n1")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["root", "user"])
def test_four_starts_of_the_same_job_at_once_give_one_daemon_per_gpu(
    node: SimNode, mode: str
) -> None:
    user = None
    if mode == "user":
        if os.geteuid() != 0:
            pytest.skip("needs root to run as the test user")
        user = ensure_test_user()
    argv = [sys.executable, "-m", "mpswrap", "start", *JOB, "--json"]
    env = node.env()
    if user:
        argv = user_argv(user, argv, env)
    results = _together([argv] * 4, [env] * 4)
    assert [r[0] for r in results] == [0] * 4, [r[2] for r in results]
    seen = {tuple(m["daemon_pid"] for m in json.loads(r[1])) for r in results}
    assert len(seen) == 1, seen  # everyone got the same two daemons
    layout = node.layout("j1", admin=None if user is None else False)
    for key in ("g0", "g1"):
        assert len(daemons_of(layout.gpu(key).pipe)) == 1, key
    res = node.mpswrap("stop", *JOB, user=user)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_nothing_left(node, layout.job_dir)


# --- start-up faults ----------------------------------------------------------------------------
def test_a_gpu_whose_daemon_cannot_start_gives_one_line_and_leaves_nothing(node: SimNode) -> None:
    node.faults.write_text(json.dumps({"start": "fail"}))
    res = node.mpswrap("start", *JOB)
    assert res.returncode == 1
    assert res.stderr.rstrip("\n").replace(str(node.root), "<root>") == (
        f"mpswrap: couldn't start MPS ({UUID0}, pipe <root>/{job_dir(node).relative_to(node.root)}"
        "/g0/pipe): nvidia-cuda-mps-control -d exited 1: nvidia-cuda-mps-control: failed to "
        "start (simulated by MPSWRAP_SIM_FAULTS)\nhint: is the NVIDIA driver loaded? run nvidia-smi"
    )
    assert_nothing_left(node, job_dir(node))


def test_when_the_second_gpu_fails_the_first_gpus_daemon_is_stopped_too(node: SimNode) -> None:
    res = node.mpswrap("start", *JOB, MPSWRAP_CONTROL_BINARY=gpu1_broken(node))
    assert res.returncode == 1
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("mpswrap: couldn't")]
    assert len(errors) == 1 and f"({UUID1}, pipe " in errors[0], res.stderr
    assert "started MPS daemon pid" in res.stderr  # GPU 0's daemon did start ...
    started = int(re.findall(r"started MPS daemon pid (\d+)", res.stderr)[0])
    assert gone(started)  # ... and was stopped with the failed start
    assert_nothing_left(node, job_dir(node))


@pytest.fixture
def four_gpus() -> Iterator[SimNode]:
    with sim_node(gpus=4) as sim:
        yield sim


def gpu1_broken(node: SimNode) -> str:
    """A control program that fails to start only for GPU 1, as a broken GPU would."""
    (node.root / "fail.json").write_text(json.dumps({"start": "fail"}))
    wrapper = node.bin / "mps-control-gpu1-broken"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH={REPO}; export PYTHONPATH\n"
        f"MPSWRAP_SIM_FAULTS={node.faults}\n"
        f'if [ "$1" = -d ] && [ "$CUDA_VISIBLE_DEVICES" = {UUID1} ]; then\n'
        f"  MPSWRAP_SIM_FAULTS={node.root / 'fail.json'}\n"
        "fi\n"
        "export MPSWRAP_SIM_FAULTS\n"
        f'exec {sys.executable} -m mpswrap.sim.control "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_nodes_daemons_come_up_together(four_gpus: SimNode) -> None:
    # Each simulated daemon takes 2 s to answer: one after another, 4 GPUs take over 8 s.
    four_gpus.faults.write_text(json.dumps({"start": "slow:2"}))
    t0 = time.monotonic()
    manifests = start(four_gpus)
    took = time.monotonic() - t0
    four_gpus.faults.write_text("{}")
    assert len(manifests) == 4
    assert took < 6.5, f"4 daemons took {took:.1f} s: started one after another"
    res = four_gpus.mpswrap("stop", *JOB)
    assert res.returncode == 0, res.stderr
    assert_nothing_left(four_gpus, job_dir(four_gpus))


def test_a_failing_gpu_stops_the_daemons_launched_after_it_too(four_gpus: SimNode) -> None:
    # GPU 1's control program fails; GPUs 2 and 3 are launched by then and waited for later.
    res = four_gpus.mpswrap("start", *JOB, MPSWRAP_CONTROL_BINARY=gpu1_broken(four_gpus))
    assert res.returncode == 1
    assert f"mpswrap: couldn't start MPS ({UUID1}, pipe " in res.stderr, res.stderr
    assert_nothing_left(four_gpus, job_dir(four_gpus))
    # The locks were released: the job starts at once with a working control program.
    manifests = start(four_gpus)
    assert len(manifests) == 4
    assert four_gpus.mpswrap("stop", *JOB).returncode == 0
    assert_nothing_left(four_gpus, job_dir(four_gpus))


@pytest.mark.parametrize(
    ("faults", "log"),
    [
        ({"die_on": ["get_server_list"]}, r".*Cmd:get_server_list"),
        ({"start": "die"}, r"\(empty\)"),
    ],
    ids=["dies-on-get_server_list", "dies-while-starting"],
)
def test_a_daemon_that_dies_during_start_gives_one_line_and_leaves_nothing(
    node: SimNode, faults: dict[str, object], log: str
) -> None:
    node.faults.write_text(json.dumps(faults))
    res = node.mpswrap("start", *JOB, "--gpus", "0", MPSWRAP_START_TIMEOUT="3")
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    assert len(lines) == 1, lines
    assert re.fullmatch(
        rf"mpswrap: MPS control daemon did not answer \({UUID0}\): no reply to get_server_list "
        rf"in 3 s; control\.log: {log}",
        lines[0],
    ), lines[0]
    assert_nothing_left(node, job_dir(node))


@needs_root
def test_the_epilog_keeps_a_record_with_the_documented_fields(node: SimNode) -> None:
    from mpswrap.mps.record import FIELDS

    archive = node.root / "archive"
    admin_config(node, log_archive=str(archive), terminate_window="10")
    assert slurm_hook(node, "prolog").returncode == 0
    g0 = node.layout("101", admin=True).gpu("g0")
    clients = [
        spawn_as(
            ensure_test_user(),
            [node.client, "--seconds", "60"],
            CUDA_MPS_PIPE_DIRECTORY=str(g0.pipe),
            CUDA_MPS_LOG_DIRECTORY=str(g0.log),
        )
        for _ in range(4)
    ]
    try:
        deadline = time.monotonic() + 30
        while not all(f"NEW CLIENT {c.pid} " in _text(g0.control_log) for c in clients):
            assert time.monotonic() < deadline, "4 clients did not connect"
            time.sleep(0.1)
        end = slurm_hook(node, "epilog")
        assert end.returncode == 0, end.stderr
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
            c.communicate()
    report = node.run("report", "101", "--json", MPSWRAP_CONFIG=str(node.root / "mpswrap.conf"))
    assert report.returncode == 0, report.stderr
    records = json.loads(report.stdout)
    # Oldest first: the GPUs' teardowns run side by side, so either may have ended first.
    by_gpu = {r["gpu"]: r for r in records}
    assert len(records) == 2 and sorted(by_gpu) == ["g0", "g1"], records
    assert all(set(r) == set(FIELDS) for r in records), "the fields reference.md lists"
    g0_record = by_gpu["g0"]
    assert sorted(g0_record["ended_by_terminate_client"]) == sorted(c.pid for c in clients)
    assert g0_record["started_by"] == "prolog" and g0_record["user"] == ensure_test_user()
    assert sorted(p.name for p in archive.glob("n1-101-g0-*")) == [
        "n1-101-g0-control.log",
        "n1-101-g0-record.json",
        "n1-101-g0-server.log",
    ]


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
