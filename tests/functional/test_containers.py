"""Ranks that are container runtimes, on the simulator: rootless Podman (the container started
outside the rank's process tree, by conmon) and bubblewrap set up as Apptainer sets up a
container (a descendant, in its own mount, PID and IPC namespaces).

With ``mpswrap container-args``' flags the client attaches, is verified by the PID the server
lists it by (its host PID: inside, it is PID 1, or 2 under bubblewrap's init), and a signal
ends it through terminate_client by that PID; nothing is left. Without the bind (or the
variables), the run is refused in one line before anything starts, and a dry run says the
same. tests/containers.py holds what this machine needs to run Podman at all.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.containers import PodmanUser, bwrap, line, tools_missing
from tests.procs import signal_tree
from tests.simenv import SimNode
from tests.users import TEST_USER
from tests.waits import wait_until

from .test_launcher import by_tag, records, summaries

pytestmark = pytest.mark.functional


@pytest.fixture
def pod(one_gpu: SimNode) -> Iterator[PodmanUser]:
    assert not tools_missing(), f"missing {tools_missing()} (tools/test.sh installs them)"
    user = PodmanUser(one_gpu).prepare()
    try:
        yield user
    finally:
        user.close()


def _shared(node: SimNode) -> Path:
    out = node.root / "out"
    out.mkdir(mode=0o777, exist_ok=True)
    out.chmod(0o777)
    return out


def _client(node: SimNode, rec: Path, seconds: float) -> list[str]:
    return [node.client, "--seconds", str(seconds), "--record", str(rec)]


def _error(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("mpswrap: ")]


def _signal_supervisor(proc: subprocess.Popen[str], sig: int) -> None:
    """Signal ``mpswrap run`` itself (the test user's child of runuser), as a terminal's ^C
    or a ``kill`` of the supervisor does. (scancel signals podman as well, which then leaves
    its container at once: the client is ended by the same terminate_client, from the
    rank's leftovers, but the run's exit code may be podman's.)"""
    for member in psutil.Process(proc.pid).children(recursive=True):
        parent = member.parent()
        if member.username() == TEST_USER and parent is not None and parent.name() == "runuser":
            member.send_signal(sig)
            return
    raise AssertionError("no mpswrap run under runuser")


def _sigterm_once_started(
    proc: subprocess.Popen[str], rec: Path, send: Callable[[subprocess.Popen[str], int], object]
) -> str:
    """SIGTERM by ``send`` once the client has started; the run's stderr, the run reaped."""
    try:
        wait_until(lambda: by_tag(records(rec), "start"), 60, "the client to start")
        send(proc, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return err


# Podman runs each container in a PID namespace of its own here: crun refuses --pid=host
# where it may not create cgroups (this machine). The client is PID 1 inside.
# The run's own ranks (``mpswrap run``), and per-rank mode as ``srun mpswrap podman run …``
# starts each task: the same check, the same verification through the rank's tag.
@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", [("run", "-n", "1"), ()], ids=["run", "per-rank"])
def test_a_podman_rank_is_verified_by_its_host_pid(pod: PodmanUser, mode: tuple[str, ...]) -> None:
    node, rec = pod.node, _shared(pod.node) / "rec.json"
    argv = pod.podman(pod.container_args(), _client(node, rec, 2), rec.parent)
    res = pod.run(*mode, "--verify-attach", "fail", "--", *argv)
    assert res.returncode == 0, res.stderr
    start = by_tag(records(rec), "start")["None"]
    assert start["mode"] == "mps", start
    assert start["ns_pid"] == 1 and start["pid"] != 1, start
    # Seen listed while it ran: only the rank's tag, passed into the container, finds it.
    assert summaries(res.stderr)[0][2] == "1 attached", res.stderr


@pytest.mark.timeout(180)
def test_a_podman_rank_is_ended_by_terminate_client(pod: PodmanUser) -> None:
    node, rec = pod.node, _shared(pod.node) / "rec.json"
    flags = pod.container_args()
    proc = pod.start(
        "run", "-n", "1", "--", *pod.podman(flags, _client(node, rec, 120), rec.parent)
    )
    err = _sigterm_once_started(proc, rec, _signal_supervisor)
    assert proc.returncode == 128 + signal.SIGTERM, err
    end = by_tag(records(rec), "end")["None"]
    assert end["reason"] == "terminated", (end, err)  # terminate_client, not the signal
    assert summaries(err)[0][4] == "1", err  # "1 ended by terminate_client"


@pytest.mark.timeout(180)
def test_a_farm_of_podman_tasks_attaches_and_leaves_nothing(pod: PodmanUser) -> None:
    node, out = pod.node, _shared(pod.node)
    flags = pod.container_args()
    tasks = node.root / "TASKS"
    tasks.write_text(
        "".join(
            line(pod.podman(flags, _client(node, out / f"rec{i}.json", 2), out)) + "\n"
            for i in range(2)
        )
    )
    tasks.chmod(0o644)
    res = pod.run("farm", "--verify-attach", "fail", "--progress", "off", str(tasks))
    assert res.returncode == 0, res.stderr
    for i in range(2):
        assert by_tag(records(out / f"rec{i}.json"), "start")["None"]["mode"] == "mps"
    assert summaries(res.stderr)[0][2] == "2 attached", res.stderr


# --- refused before anything starts --------------------------------------------------------
def _without(flags: list[str], *names: str) -> list[str]:
    """``flags`` less the options (with their values) that name one of ``names``."""
    out: list[str] = []
    for flag, value in zip(flags[::2], flags[1::2], strict=False):
        if not any(n in value for n in names):
            out += [flag, value]
    return out + ([flags[-1]] if len(flags) % 2 else [])


def _jobless(lines: list[str]) -> list[str]:
    return [re.sub(r"(run|farm)-[0-9]+", r"\1-N", x) for x in lines]


MISSING = {
    # what is left out -> the words of the refusal
    "the bind": ("/user/", "does not bind the MPS pipe directory"),
    "CUDA_MPS_PIPE_DIRECTORY": ("CUDA_MPS_PIPE_DIRECTORY", "does not pass CUDA_MPS_PIPE_DIRECTORY"),
    "the rank's tag": ("MPSWRAP_TREE", "does not pass MPSWRAP_TREE"),
}


@pytest.mark.parametrize("mode", ["run", "farm"])
@pytest.mark.parametrize("missing", sorted(MISSING))
def test_a_podman_rank_missing_a_flag_is_refused_in_one_line(
    one_gpu: SimNode, mode: str, missing: str
) -> None:
    node, rec = one_gpu, one_gpu.root / "rec.json"
    flags = node.run("container-args", "podman")
    assert flags.returncode == 0, flags.stderr
    cut, words = MISSING[missing]
    # The container's root is made up: nothing may start, so nothing looks at it.
    argv = PodmanUser(node).podman(
        _without(flags.stdout.split(), cut), _client(node, rec, 1), _shared(node)
    )
    (node.root / "TASKS").write_text(line(argv) + "\n")
    args = ["run", "-n", "1", "--", *argv] if mode == "run" else ["farm", "TASKS"]
    real = node.run(*args)
    dry = node.run(args[0], "--dry-run", *args[1:])
    errors = _error(real.stderr)
    assert real.returncode == 2 and len(errors) == 1, real.stderr
    assert words in errors[0] and "mpswrap container-args podman" in errors[0], errors
    assert errors[0].startswith("mpswrap: task 0: " if mode == "farm" else "mpswrap: podman")
    # The same words, but for the job's name: a run names its own (run-<its pid>).
    assert (dry.returncode, _jobless(_error(dry.stderr))) == (2, _jobless(errors)), dry.stderr
    assert "GPU daemon(s)" not in real.stderr and not rec.exists(), real.stderr


# --- bubblewrap, as Apptainer sets a container up ------------------------------------------
def _bwrap_flags(node: SimNode) -> list[str]:
    res = node.run("container-args", "bwrap")
    assert res.returncode == 0, res.stderr
    words = res.stdout.split()
    assert words[0] == "--bind" and words[1] == words[2], words
    return [words[1]]


@pytest.mark.timeout(120)
def test_a_bwrap_rank_attaches_is_verified_and_ended_by_terminate_client(
    one_gpu: SimNode,
) -> None:
    node, rec = one_gpu, _shared(one_gpu) / "rec.json"
    binds = [*_bwrap_flags(node), str(node.bin), str(rec.parent)]
    argv = bwrap(binds, _client(node, rec, 120), hide=["/tmp"])
    proc = node.start("run", "-n", "1", "--", *argv)
    err = _sigterm_once_started(proc, rec, signal_tree)
    start = by_tag(records(rec), "start")["None"]
    assert start["mode"] == "mps" and start["ns_pid"] != start["pid"], start
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert by_tag(records(rec), "end")["None"]["reason"] == "terminated", err
    assert summaries(err)[0][4] == "1", err  # "1 ended by terminate_client"


@pytest.mark.parametrize("dry", [False, True])
def test_a_bwrap_rank_that_hides_the_pipe_directory_is_refused(one_gpu: SimNode, dry: bool) -> None:
    node, rec = one_gpu, _shared(one_gpu) / "rec.json"
    argv = bwrap([str(node.bin), str(rec.parent)], _client(node, rec, 1), hide=["/tmp"])
    res = node.run("run", *(["--dry-run"] if dry else []), "-n", "1", "--", *argv)
    errors = _error(res.stderr)
    assert res.returncode == 2 and len(errors) == 1, res.stderr
    assert "bwrap does not bind the MPS pipe directory at the same path" in errors[0], errors
    assert "add --bind " in errors[0], errors
    assert not rec.exists()


def test_a_client_that_cannot_see_its_pipe_directory_runs_without_mps(one_gpu: SimNode) -> None:
    """What the real driver does (docs/gpu-results/2026-11-25-containers), and why mpswrap
    refuses such a rank: the simulated client, too, runs without MPS, silently."""
    node, rec = one_gpu, _shared(one_gpu) / "rec.json"
    started = node.run("start", "--job", "hidden", "--gpus", "0")
    assert started.returncode == 0, started.stderr
    try:
        pipe = node.started("hidden").pipe
        argv = bwrap([str(node.bin), str(rec.parent)], _client(node, rec, 0.1), hide=["/tmp"])
        env = node.env(CUDA_MPS_PIPE_DIRECTORY=str(pipe))
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    finally:
        assert node.run("stop", "--job", "hidden").returncode == 0
    assert res.returncode == 0 and "mode=non-mps" in res.stdout, res
    assert by_tag(records(rec), "start")["None"]["mode"] == "non-mps"
