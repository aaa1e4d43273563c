"""session() in one process, without mpirun: the pre-MPI path, the comm path on COMM_SELF,
refusals, and cleanup, against the MPS simulator and a fake GPU inventory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from mpswrap import _proc, session
from mpswrap.config import load_settings
from mpswrap.errors import MpswrapError
from mpswrap.job.job import JobDaemons
from mpswrap.jobenv import JobEnv
from mpswrap.mps.gpu import load_inventory
from mpswrap.mps.start import Defaults
from mpswrap.paths import JobLayout
from tests.procs import described
from tests.simenv import SimFiles

pytestmark = [
    pytest.mark.functional,
    # The watchdog outlives its owner by design: its Popen, kept in owners._WATCHDOGS, warns
    # when it is collected at exit with the watchdog still running.
    pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning"),
]

NODE = JobEnv({}).node


@dataclass(frozen=True)
class Sim(SimFiles):
    """A short private root with the simulated MPS and GPUs (``uuids`` in NVML order) and
    run dirs."""

    uuids: tuple[str, ...] = ()

    @property
    def user_run(self) -> Path:
        return self.root / "u"

    @property
    def admin_run(self) -> Path:
        return self.root / "a"

    def env(self) -> dict[str, str]:
        return {
            "MPSWRAP_CONTROL_BINARY": self.control,
            "MPSWRAP_GPU_INVENTORY": str(self.inventory),
            "MPSWRAP_USER_RUN_DIR": str(self.user_run),
            "MPSWRAP_RUN_DIR": str(self.admin_run),
        }

    def start_client(self, seconds: float = 3.0) -> subprocess.Popen[str]:
        """A fake CUDA process: inherits os.environ, so the session's MPS variables."""
        return subprocess.Popen(
            [self.client, "--seconds", str(seconds)],
            env=dict(os.environ),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def leftovers(self) -> list[psutil.Process]:
        """Every process whose command line or environment mentions this root."""
        me = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if proc.pid in me or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                text = " ".join(proc.info["cmdline"] or ())
                if str(self.root) in text or any(
                    str(self.root) in v for v in proc.environ().values()
                ):
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def wait_nothing_left(self, timeout: float = 15.0) -> list[psutil.Process]:
        deadline = time.monotonic() + timeout
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left


def make_sim(gpus: int = 2) -> Sim:
    # Short root: MPS socket paths must stay under 107 bytes.
    files = SimFiles(Path(tempfile.mkdtemp(prefix="mpsw-", dir="/tmp")))
    files.install(gpus)
    data = json.loads(files.inventory.read_text())
    return Sim(files.root, tuple(g["uuid"] for g in sorted(data["gpus"], key=lambda g: g["index"])))


def finish(client: subprocess.Popen[str]) -> int:
    """Wait for a fake CUDA process and close its pipe; its exit status."""
    client.communicate(timeout=30)
    return client.returncode


def finish_sim(sim: Sim) -> None:
    """Kill and report whatever of this root survived, then remove it."""
    left = sim.wait_nothing_left(timeout=8.0)
    # Named before the kill: a killed process is a zombie, whose command line is refused.
    named = [what for p in left if (what := described(p)) is not None and _kill(p)]
    shutil.rmtree(sim.root, ignore_errors=True)
    assert not named, f"left behind: {named}"


def _kill(proc: psutil.Process) -> bool:
    try:
        proc.send_signal(signal.SIGKILL)
        return True
    except psutil.Error:
        return False


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sim]:
    made = make_sim()
    for name, value in made.env().items():
        monkeypatch.setenv(name, value)
    try:
        yield made
    finally:
        finish_sim(made)


def layout(sim: Sim, job: str = "local", admin: bool = False) -> JobLayout:
    return JobLayout(sim.admin_run if admin else sim.user_run, NODE, job)


def job_dir(sim: Sim, job: str = "local", admin: bool = False) -> Path:
    return layout(sim, job, admin).job_dir


def local_ranks(monkeypatch: pytest.MonkeyPatch, rank: int, size: int) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", str(rank))
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", str(size))


# --- without the simulator -------------------------------------------------------------------
def test_refuses_when_torch_says_cuda_started(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    local_ranks(monkeypatch, 0, 1)
    fake_torch = SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    with pytest.raises(MpswrapError) as info, session():
        pytest.fail("entered a session after CUDA started")
    assert "CUDA is already initialised" in str(info.value)
    assert "torch.cuda.is_initialized()" in str(info.value)
    assert "session() before any CUDA use" in (info.value.hint or "")
    assert not sim.user_run.exists(), "refused, yet created state"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    # The refusal released the process-wide slot: fixing the cause makes it work.
    monkeypatch.setattr(fake_torch.cuda, "is_initialized", lambda: False)
    with session() as s:
        assert s.mode == "user"


def test_import_mpswrap_stays_light_and_session_is_callable() -> None:
    code = (
        "import sys, mpswrap, mpswrap.entry.session; s = mpswrap.session; "
        "assert callable(s) and s is mpswrap.entry.session.session, s; "
        "bad = [m for m in ('mpi4py', 'pynvml') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- with the simulator ----------------------------------------------------------------------
def test_pre_mpi_path_places_sets_env_and_cleans_up(
    sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_ranks(monkeypatch, 1, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    had_mpi = "mpi4py.MPI" in sys.modules
    with session(threads="uniform") as s:
        assert (s.mode, s.local_rank, s.local_size) == ("user", 1, 2)
        assert s.gpu_uuid == sim.uuids[1], "block placement: local rank 1 of 2 -> GPU 1"
        assert s.pipe_dir == layout(sim).gpu("g1").pipe
        assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(s.pipe_dir)
        assert os.environ["CUDA_MPS_LOG_DIRECTORY"] == str(s.log_dir)
        assert os.environ["CUDA_VISIBLE_DEVICES"] == s.gpu_uuid
        assert os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
        client = sim.start_client()
        server = s.check_attached(pid=client.pid, timeout=20)
        assert psutil.pid_exists(server)
        assert finish(client) == 0, client.stdout
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1", "environment not restored"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert not job_dir(sim).exists(), "the last owner left its daemons"
    assert ("mpi4py.MPI" in sys.modules) == had_mpi, "the pre-MPI path imported MPI"
    assert not sim.wait_nothing_left()


def test_check_attached_names_the_pipe_dir(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    local_ranks(monkeypatch, 0, 1)
    with session() as s:
        start = time.monotonic()
        with pytest.raises(MpswrapError) as info:
            s.check_attached(timeout=0.5)
        assert time.monotonic() - start < 10
        assert str(s.pipe_dir) in str(info.value)
        assert "after the first CUDA call" in (info.value.hint or "")
        assert not s.is_client()


def test_nested_and_second_sessions_are_refused(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    local_ranks(monkeypatch, 0, 1)
    outer = session()
    with outer as s:
        with pytest.raises(MpswrapError, match="already active"), session():
            pass
        with pytest.raises(MpswrapError, match="already active"):
            outer.__enter__()
        assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(s.pipe_dir), "refusal undid ours"
    assert not job_dir(sim).exists()
    with session() as again:  # after the first ended, a new one is fine
        assert again.gpu_uuid == sim.uuids[0]


def test_exception_propagates_after_local_cleanup(
    sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_ranks(monkeypatch, 0, 1)

    def body() -> None:
        with session():
            assert job_dir(sim).exists()
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        body()
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert not job_dir(sim).exists()


def test_cuda_started_with_other_mps_env_is_refused_after_cleanup(
    sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_ranks(monkeypatch, 0, 1)
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    fake_torch = SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    with pytest.raises(MpswrapError, match="CUDA is already initialised"), session():
        pass
    assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert not job_dir(sim).exists()


def test_prolog_daemons_are_used_and_left_running(
    sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_ranks(monkeypatch, 0, 1)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    settings = load_settings()
    daemons = JobDaemons(layout(sim, "4242", admin=True), settings)
    gpus = load_inventory(str(sim.inventory)).gpus
    manifests = daemons.start(
        gpus, _proc.lookup_user(), started_by="prolog", defaults=Defaults(), shared_parents=True
    )
    try:
        with session() as s:
            assert s.mode == "prolog"
            assert s.pipe_dir == layout(sim, "4242", admin=True).gpu("g0").pipe
            client = sim.start_client(1)
            s.check_attached(pid=client.pid, timeout=20)
            assert finish(client) == 0, client.stdout
        assert all(_proc.is_alive(m.daemon) for m in manifests), "session stopped the prolog's"
        assert not job_dir(sim, "4242").exists(), "user-mode daemons started beside the prolog's"
    finally:
        done = daemons.stop()
    assert done.clean, done.lines()


def test_comm_path_on_comm_self_in_a_fresh_process(sim: Sim, tmp_path: Path) -> None:
    """mpi4py imported (and MPI initialised) first: the leader-first path, one rank."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import json, os\n"
        "from mpi4py import MPI\n"
        "from mpswrap import session\n"
        "with session(MPI.COMM_SELF) as s:\n"
        "    print(json.dumps([s.mode, s.local_rank, s.local_size, s.gpu_uuid,\n"
        "                      os.environ['CUDA_MPS_PIPE_DIRECTORY']]))\n"
    )
    res = subprocess.run(
        [sys.executable, str(script)], text=True, capture_output=True, timeout=90, check=False
    )
    assert res.returncode == 0, res.stderr
    mode, rank, size, uuid, pipe = json.loads(res.stdout.strip().splitlines()[-1])
    assert (mode, rank, size, uuid) == ("user", 0, 1, sim.uuids[0])
    assert pipe.startswith(str(sim.user_run))
    assert not sim.wait_nothing_left(), "daemons outlived a single-process session"


def test_a_rank_that_is_still_a_client_leaves_the_stop_to_the_watchdog(
    sim: Sim, tmp_path: Path
) -> None:
    """CUDA keeps its context until the process exits: the session must not stop the daemons
    under itself (the ladder would terminate and SIGKILL it); the watchdog does it after."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import json\n"
        "from mpswrap import _proc\n"
        "from mpswrap import session\n"
        "from mpswrap.sim.client import Client, parse\n"
        "with session() as s:\n"
        "    client = Client(parse([]))\n"
        "    assert client.attach() is not None  # this very process is an MPS client now\n"
        "    server = s.check_attached(timeout=20)\n"
        "    job = s.pipe_dir.parents[1]\n"
        "manifest = json.loads((s.pipe_dir.parent / 'manifest.json').read_text())\n"
        "alive = _proc.is_alive(_proc.ProcId(manifest['daemon_pid'], "
        "manifest['daemon_start_time']))\n"
        "print(json.dumps([alive, s.is_client(), str(job)]))\n"
    )
    env = {**os.environ, "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
    res = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        text=True,
        capture_output=True,
        timeout=90,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    alive, still_client, job = json.loads(res.stdout.strip().splitlines()[-1])
    assert alive and still_client, "the session stopped the daemons under a live client"
    assert not sim.wait_nothing_left(), "the watchdog did not stop the daemons after exit"
    assert not Path(job).exists()


def test_mpi4py_auto_init_disabled_is_respected(sim: Sim, tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(
        "import json, mpi4py\n"
        "mpi4py.rc.initialize = False\n"
        "from mpi4py import MPI\n"
        "from mpswrap import session\n"
        "with session() as s:\n"
        "    print(json.dumps([MPI.Is_initialized(), s.local_rank, s.local_size]))\n"
    )
    res = subprocess.run(
        [sys.executable, str(script)], text=True, capture_output=True, timeout=90, check=False
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [False, 0, 1]
    assert not sim.wait_nothing_left()
