"""A real Slurm cluster on this machine for the integration tests, and the checks that every
test leaves nothing behind.

``Cluster.start()`` runs tests/integration/cluster/up.sh: munged, slurmctld and two slurmd
(node1, node2; 2 fake GPUs and gres/mps each), with mpswrap's hooks installed by
mpswrap/slurm/install.sh as an admin would, the MPS simulator as the control binary and a fake GPU
inventory whose NVML order differs from the device-minor order. Everything lives in one
world-traversable ``/tmp/mpswrap-slurm.XXXX`` directory: jobs of the non-root test users must
reach slurm.conf, the munge socket, the hooks and the simulator.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from mpswrap._cgroup import Cgroup, parent_dir
from mpswrap.paths import JobLayout
from tests.procs import described
from tests.simenv import SimFiles
from tests.tree import PACKAGE, REPO
from tests.users import ensure_user, user_argv
from tests.waits import wait_until

SCRIPTS = REPO / "tests" / "integration" / "cluster"
USER = "mpsuser"  # every test job runs as this user
USER2 = "mpsuser2"  # a second, unrelated user
NODES = ("node1", "node2")
GPUS_PER_NODE = 2
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
#: ``sinfo %t`` of a node that is fine: anything else (drain, drng, down, a trailing ``*`` for
#: "not responding", ...) means a test broke the node.
HEALTHY = {"idle", "mix", "alloc", "comp"}
#: Job states after which nothing of the job runs any more (squeue shows COMPLETING until
#: every node's epilog has finished).
FINISHED = {
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
    "REVOKED",
}


def why_not_runnable() -> str | None:
    """A skip reason, or None when this machine can run the cluster."""
    if os.geteuid() != 0:
        return "needs root (runs slurmctld/slurmd, creates the test users mpsuser, mpsuser2)"
    missing = [
        b
        for b in ("slurmctld", "slurmd", "munged", "srun", "runuser", "cc")
        if shutil.which(b, path=SAFE_PATH) is None
    ]
    if not Path("/usr/include/slurm/spank.h").exists():
        missing.append("slurm/spank.h")
    if missing:
        return (
            f"needs Slurm, munge, Slurm's headers and cc for the SPANK plugin "
            f"({', '.join(missing)} missing): apt-get install slurmctld slurmd slurm-client "
            "munge libslurm-dev gcc"
        )
    return None


def sh(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 30,
    check: bool = True,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv, capture text output; with check, fail with everything it printed."""
    res = subprocess.run(
        list(argv),
        env=env,
        cwd=cwd,
        text=True,
        capture_output=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if check and res.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, argv))} exited {res.returncode}\n"
            f"stdout: {res.stdout}\nstderr: {res.stderr}"
        )
    return res


def read_records(path: Path, event: str = "start") -> list[dict[str, Any]]:
    """The JSON lines mps-sim-client --record appended, of one event kind."""
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in lines if r.get("event") == event]


@dataclass
class Job:
    id: str
    proc: subprocess.CompletedProcess[str] | None = None

    @property
    def output(self) -> str:
        if self.proc is None:
            return ""
        proc = self.proc
        return f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


class Cluster:
    """One test cluster in ``state`` (see tests/integration/cluster/up.sh)."""

    def __init__(
        self,
        state: Path,
        python: str,
        isolate: str,
        *,
        hooks: bool = True,
        features: str = "",
        knobs: dict[str, str] | None = None,
    ) -> None:
        self.state = state
        self.python = python
        self.isolate = isolate
        #: False: slurm.conf names no Prolog, Epilog or TaskProlog (the admin-guide test
        #: installs the hooks and adds the lines itself).
        self.with_hooks = hooks
        #: ``Features=`` of every node ("" for none).
        self.features = features
        #: More of up.sh's knobs (e.g. CPUS_PER_NODE, TASK_PLUGIN, CGROUP_CONF, SELECT_PARAMS).
        self.knobs = dict(knobs or {})

    # --- paths ---------------------------------------------------------------------------
    @property
    def etc(self) -> Path:
        return self.state / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def config_path(self) -> Path:
        return self.etc / "mpswrap.conf"

    @property
    def sim(self) -> SimFiles:
        """The simulated MPS and GPUs of every node; ``sim.client`` is the simulated CUDA
        program (prints and records whether it attached to MPS). Under the root-owned state
        directory: root's hooks run ``sim.control`` only if no user can change it."""
        return SimFiles(self.state / "sim")

    @property
    def run_dir(self) -> Path:
        return self.state / "mpswrap-run"

    @property
    def hooks(self) -> Path:
        return self.state / "hooks-installed"

    def pipe(self, node: str, job: str, position: int) -> str:
        return str(JobLayout(self.run_dir, node, job).gpu(f"g{position}").pipe)

    def base_config(self) -> dict[str, str]:
        return {
            "run_dir": str(self.run_dir),
            "control_binary": self.sim.control,
            "gpu_inventory": str(self.sim.inventory),
            "prolog_mode": "opt-in",
            "opt_in": "gres-mps, spank, feature:mps, comment:mps",
            "prolog_failure": "drain",
        }

    # --- bring-up and teardown -----------------------------------------------------------
    @classmethod
    def start(
        cls,
        python: str | None = None,
        *,
        hooks: bool = True,
        features: str = "",
        knobs: dict[str, str] | None = None,
    ) -> Cluster:
        """Bring a cluster up. ``python`` runs the hooks (installed into it as an admin
        would): by default this interpreter, or ``MPSWRAP_TEST_PYTHON``. ``hooks=False``: no
        hooks installed or configured. ``features``: every node's ``Features=``. ``knobs``:
        more of up.sh's settings."""
        python = python or os.environ.get("MPSWRAP_TEST_PYTHON") or sys.executable
        for user in (USER, USER2):
            ensure_user(user, home=True)
        state = Path(tempfile.mkdtemp(prefix="mpswrap-slurm.", dir="/tmp"))
        state.chmod(0o755)  # mkdtemp makes 0700: job users could not reach anything
        # We made the directory: claim it for up.sh, so it keeps the hooks installed below.
        (state / ".mpswrap-slurm-state").touch()
        # Own hostnames per node where the kernel lets us: mpirun in a batch script then sees
        # itself on node1 and starts its ranks there (as on a real cluster) instead of
        # launching an orted through srun.
        isolate = os.environ.get("MPSWRAP_TEST_ISOLATE") or (
            "uts"
            if subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0
            else "none"
        )
        cluster = cls(state, python, isolate, hooks=hooks, features=features, knobs=knobs)
        try:
            if hooks:
                cluster._install_hooks()
            cluster._up()
            cluster._install_sim()
            cluster.write_config()
        except BaseException:
            with contextlib.suppress(AssertionError):  # keep the first error, not down.sh's
                cluster.stop(purge=False)
            raise
        return cluster

    def _install_hooks(self) -> None:
        # As an admin would; the config file does not exist yet (up.sh makes etc/), which
        # install.sh only warns about.
        install = str(PACKAGE / "slurm" / "install.sh")
        sh(
            [
                install,
                "--python",
                self.python,
                "--config",
                str(self.config_path),
                "--dest",
                str(self.hooks),
                "--spank",  # sbatch/srun --mps[=POLICY], built against this Slurm's spank.h
            ],
            timeout=60,
        )

    def _up(self) -> None:
        # The caller's environment passes through: up.sh's other knobs (DEBUG_LEVEL,
        # PROCTRACK, TASK_PLUGIN, CGROUP_CONF, ...) can be set from outside.
        env = dict(
            os.environ,
            PATH=SAFE_PATH,
            NODES=str(len(NODES)),
            GPUS_PER_NODE=str(GPUS_PER_NODE),
            SHARING="mps",
            CPUS_PER_NODE="8",
            PROLOG_FLAGS="Alloc",
            PROLOG=str(self.hooks / "prolog"),
            EPILOG=str(self.hooks / "epilog"),
            TASK_PROLOG=str(self.hooks / "task_prolog"),
            FEATURES=self.features,
            PLUGSTACK=f"optional {self.hooks / 'mpswrap_spank.so'}\n",
            ISOLATE=self.isolate,
            INSTALL="0",
            # no smoke job yet: the hooks would fail without their config file
            SMOKE="0",
        )
        env.update(self.knobs)
        if not self.with_hooks:
            env.update(PROLOG="none", EPILOG="none", PROLOG_FLAGS="", PLUGSTACK="")
            del env["TASK_PROLOG"]
        sh([str(SCRIPTS / "up.sh"), str(self.state)], env=env, timeout=120)

    def _install_sim(self) -> None:
        self.sim.root.mkdir()
        self.sim.root.chmod(0o755)  # job users run the programs; only root may change them
        self.sim.install(GPUS_PER_NODE, python=self.python)

    def stop(self, *, purge: bool) -> str:
        """down.sh; raise if anything of the cluster survived it."""
        env = dict(os.environ, PATH=SAFE_PATH, PURGE="1" if purge else "0")
        res = sh([str(SCRIPTS / "down.sh"), str(self.state)], env=env, timeout=120, check=False)
        left = [what for p in self._processes() if (what := described(p)) is not None]
        if res.returncode != 0 or left:
            raise AssertionError(
                f"down.sh exited {res.returncode}: {res.stderr}\nstill running: " + "; ".join(left)
            )
        return res.stderr

    # --- admin config and simulator faults -------------------------------------------------
    def write_config(self, **overrides: str | None) -> None:
        """Write the admin config: the base settings, then overrides (None drops a key)."""
        values = {**self.base_config(), **overrides}
        lines = ["# written by tests/integration/harness.py"]
        lines += [f"{k} = {v}" for k, v in values.items() if v is not None]
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.chmod(0o644)  # the task prolog reads it as the job user
        tmp.replace(self.config_path)  # a hook never reads half a file

    @contextlib.contextmanager
    def config(self, **overrides: str | None) -> Iterator[None]:
        self.write_config(**overrides)
        try:
            yield
        finally:
            self.write_config()

    @contextlib.contextmanager
    def faults(self, faults: dict[str, Any]) -> Iterator[None]:
        """Faults of the simulated MPS (read at every use through MPSWRAP_SIM_FAULTS)."""
        self.sim.faults.write_text(json.dumps(faults))
        self.sim.faults.chmod(0o644)
        try:
            yield
        finally:
            self.sim.faults.unlink(missing_ok=True)

    def reset(self) -> None:
        self.write_config()
        self.sim.faults.unlink(missing_ok=True)

    # --- GPUs --------------------------------------------------------------------------------
    def inventory(self) -> list[dict[str, Any]]:
        gpus: list[dict[str, Any]] = json.loads(self.sim.inventory.read_text())["gpus"]
        return gpus

    def gpus_local_to(self, cpus: Sequence[int]) -> None:
        """Make every simulated GPU local to ``cpus`` (the inventory says NUMA halves)."""
        data = json.loads(self.sim.inventory.read_text())
        for gpu in data["gpus"]:
            gpu["cpus"] = ",".join(map(str, cpus))
        self.sim.inventory.write_text(json.dumps(data, indent=2) + "\n")

    def gres_minor(self, node: str, position: int) -> int:
        """Device minor of the node's position-th ``Name=gpu File=`` line in gres.conf."""
        files = [
            m.group(1)
            for m in re.finditer(
                rf"^NodeName={node} Name=gpu File=(\S+)$",
                (self.etc / "gres.conf").read_text(),
                re.MULTILINE,
            )
        ]
        return os.minor(os.stat(files[position]).st_rdev)

    def gpu_uuid(self, node: str, position: int) -> str:
        """What a task on gres position ``position`` must get: the GPU with that minor."""
        minor = self.gres_minor(node, position)
        uuid: str = next(g["uuid"] for g in self.inventory() if g["minor"] == minor)
        return uuid

    # --- running things as users -----------------------------------------------------------
    def env(self) -> dict[str, str]:
        return {"PATH": SAFE_PATH, "SLURM_CONF": str(self.slurm_conf), "LANG": "C.UTF-8"}

    def user_env(self, user: str) -> dict[str, str]:
        home = pwd.getpwnam(user).pw_dir
        return {**self.env(), "HOME": home, "USER": user, "LOGNAME": user}

    def _as_user(self, user: str, argv: Sequence[str], env: dict[str, str] | None) -> list[str]:
        """argv as user with a clean environment: the user's basics, SLURM_CONF, plus env."""
        return user_argv(user, argv, {**self.user_env(user), **(env or {})})

    def run_as(
        self,
        user: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        timeout: float = 60,
        cwd: Path | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        return sh(
            self._as_user(user, argv, env),
            env=self.env(),
            timeout=timeout,
            check=check,
            cwd=cwd or self.workdir("home", user),
        )

    def popen_as(self, user: str, argv: Sequence[str], cwd: Path) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self._as_user(user, argv, None),
            env=self.env(),
            cwd=cwd,
            text=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def client_argv(self, record: Path, seconds: float) -> list[str]:
        """The simulated CUDA program, recording its attachment to ``record``."""
        return [self.sim.client, "--seconds", f"{seconds:g}", "--record", str(record)]

    def workdir(self, name: str, user: str = USER) -> Path:
        """A directory the user owns, for job output and client records."""
        path = self.state / "work" / user / name
        path.mkdir(parents=True, exist_ok=True)
        for p in (self.state / "work", self.state / "work" / user):
            p.chmod(0o755)
        shutil.chown(path, user, user)
        return path

    def mpswrap(
        self, user: str, *args: str, cwd: Path | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        return self.run_as(user, [self.python, "-m", "mpswrap", *args], cwd=cwd, timeout=timeout)

    def status(self, job: str, node: str, user: str = USER) -> dict[str, Any]:
        where = ["--run-dir", str(self.run_dir), "--node", node, "--job", job]
        res = self.mpswrap(user, "status", "--json", "--config", str(self.config_path), *where)
        assert res.returncode == 0, res.stderr
        jobs: list[dict[str, Any]] = json.loads(res.stdout)["jobs"]  # --job: at most one
        assert len(jobs) <= 1, jobs
        return jobs[0] if jobs else {"gpus": []}

    # --- jobs --------------------------------------------------------------------------------
    def slurm(
        self, *argv: str, timeout: float = 30, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command as root."""
        return sh(argv, env=self.env(), timeout=timeout, check=check)

    def srun(
        self, *args: str, user: str = USER, cwd: Path | None = None, timeout: float = 90
    ) -> Job:
        """srun as user; returns once the job has left the queue and COMPLETING (epilog done)."""
        name = f"t-{uuid.uuid4().hex[:10]}"
        proc = self.run_as(user, ["srun", f"--job-name={name}", *args], cwd=cwd, timeout=timeout)
        job_id = self.job_id(name)
        assert job_id, f"no job named {name}: {proc.stderr}"
        self.wait_gone(job_id)
        return Job(job_id, proc)

    def sbatch(self, script: str, *args: str, user: str = USER, cwd: Path) -> str:
        """Submit script (text) as user; return the job id at once."""
        path = cwd / f"job-{uuid.uuid4().hex[:8]}.sh"
        path.write_text(script)
        path.chmod(0o755)
        shutil.chown(path, user, user)
        res = self.run_as(
            user,
            ["sbatch", "--parsable", "-o", str(cwd / "slurm-%j.out"), *args, str(path)],
            cwd=cwd,
            check=True,
        )
        return res.stdout.strip().split(";")[0]

    def job_id(self, name: str) -> str | None:
        res = self.slurm("squeue", "-h", "-t", "all", "-n", name, "-o", "%i")
        ids = res.stdout.split()
        return ids[-1] if ids else None

    def job_state(self, job_id: str) -> str | None:
        """squeue's state (COMPLETING while an epilog runs); None once Slurm forgot the job."""
        res = self.slurm("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T", check=False)
        if res.returncode != 0:  # "Invalid job id": purged
            return None
        return res.stdout.strip() or None

    def wait_gone(self, job_id: str, timeout: float = 60) -> str | None:
        """Wait until the job is over on every node (epilogs included); its final state."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job_id)
            if state is None or state in FINISHED:
                return state
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"job {job_id} still {state} after {timeout:g} s\n" + self.log_tail()
                )
            time.sleep(0.1)

    def wait_started(self, marker: Path, job_id: str, timeout: float = 30) -> None:
        """Wait for a file the job's script creates (so the prolog has finished)."""

        def started() -> bool:
            state = self.job_state(job_id)
            if state in FINISHED:
                raise AssertionError(f"job {job_id} ended ({state}) before {marker} appeared")
            return marker.exists()

        wait_until(started, timeout, f"{marker} of job {job_id}")

    def queue(self) -> list[str]:
        """Jobs not yet over (pending, running, completing...): ``id state user name``."""
        res = self.slurm("squeue", "-h", "-o", "%i %T %u %j")
        return [line for line in res.stdout.splitlines() if line.strip()]

    def cancel_all(self) -> None:
        ids = [line.split()[0] for line in self.queue()]
        if ids:
            self.slurm("scancel", *ids, check=False)
            for job_id in ids:
                with contextlib.suppress(AssertionError):
                    self.wait_gone(job_id, timeout=30)

    # --- node health ---------------------------------------------------------------------------
    def sinfo(self) -> list[str]:
        return self.slurm("sinfo", "-h", "-N", "-o", "%N %t %E").stdout.splitlines()

    def drained_nodes(self) -> list[str]:
        """``node state reason`` of every node that is not healthy."""
        return [line for line in self.sinfo() if line.split()[1] not in HEALTHY]

    def resume_all(self) -> None:
        for line in self.drained_nodes():
            node = line.split()[0]
            self.slurm("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        wait_until(lambda: not self.drained_nodes(), 30, "nodes to come back")

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for log in sorted((self.state / "log").glob("slurm*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(out)

    # --- leftovers -----------------------------------------------------------------------------
    def _daemon_pids(self) -> set[int]:
        pids = set()
        for pid_file in (self.state / "run").glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pids.add(int(pid_file.read_text().split()[0]))
        return pids

    def _processes(self, exclude: set[int] | None = None) -> list[psutil.Process]:
        """Live processes (by PID, via /proc) whose command line or environment names a path
        under the cluster's directory: run_dir (MPS daemons, servers, attached clients), the
        simulator, the config, SLURM_CONF (job tasks, slurmstepd). Not ours, not our
        ancestors, not the cluster's own daemons (``exclude``)."""
        marker = f"{self.state}/"
        skip = {os.getpid(), *(p.pid for p in psutil.Process().parents()), *(exclude or ())}
        found = []
        for proc in psutil.process_iter():
            if proc.pid in skip:
                continue
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                text = (
                    "\0".join(proc.cmdline())
                    + "\0"
                    + "\0".join(f"{k}={v}" for k, v in proc.environ().items())
                )
            except psutil.Error:
                continue
            if marker in text:
                found.append(proc)
        return found

    def job_dirs(self) -> list[Path]:
        """Whatever lies below ``run_dir/<node>/``: job directories the epilog must remove;
        and root's lock files of jobs (``run_dir/.locks``), which go with them."""
        if not self.run_dir.exists():
            return []
        nodes = [p for p in self.run_dir.iterdir() if p.is_dir() and p.name != ".locks"]
        locks = self.run_dir / ".locks"
        found = [*(p for node in nodes for p in node.iterdir()), *locks.glob("*")]
        return sorted(found + self.cgroups())

    def cgroups(self) -> list[Path]:
        """Root's cgroups of this cluster's jobs (``state.job_cgroup``: named after run_dir's
        checksum), which the epilog removes with the job."""
        parent = parent_dir("auto")
        if parent is None or not parent.is_dir():
            return []
        tag = f"{zlib.crc32(os.fsencode(str(self.run_dir))):08x}"
        return sorted(parent.glob(f"*.{tag}"))

    def leftovers(self) -> tuple[list[psutil.Process], list[Path]]:
        return self._processes(self._daemon_pids()), self.job_dirs()

    def wait_clean(self, timeout: float = 5) -> tuple[list[psutil.Process], list[Path]]:
        """Leftovers still there after a grace period (slurmstepd exits just after a job)."""
        deadline = time.monotonic() + timeout
        procs, dirs = self.leftovers()
        while (procs or dirs) and time.monotonic() < deadline:
            time.sleep(0.2)
            procs, dirs = self.leftovers()
        return procs, dirs

    def kill(self, procs: list[psutil.Process]) -> None:
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()  # psutil checks PID + start time: never a reused PID
        psutil.wait_procs(procs, timeout=5)

    def check_clean(self) -> list[str]:
        """After a test: jobs over, nodes healthy, nothing left. Report, then repair."""
        problems = []
        self.reset()
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not self.queue(), 30, "the queue to empty")
        if self.queue():
            problems.append("jobs still in the queue: " + "; ".join(self.queue()))
            self.cancel_all()
        bad = self.drained_nodes()
        if bad:
            problems.append("nodes not healthy (sinfo -N '%N %t %E'): " + "; ".join(bad))
            self.resume_all()
        procs, dirs = self.wait_clean()
        named = [what for p in procs if (what := described(p)) is not None]
        if named:
            problems.append("processes left behind: " + "; ".join(named))
        self.kill(procs)
        if dirs:
            problems.append("job directories left behind: " + ", ".join(map(str, dirs)))
            for path in dirs:
                if path in self.cgroups():
                    Cgroup(path).kill()
                    Cgroup(path).wait_empty(5)
                    Cgroup(path).remove()
                else:
                    shutil.rmtree(path, ignore_errors=True)
        return problems


@contextlib.contextmanager
def running_cluster(failed: Any, **options: Any) -> Iterator[Cluster]:
    """A started cluster (``Cluster.start(**options)``), stopped afterwards; when
    ``failed()`` says a test failed, its logs are kept and their path printed."""
    made = Cluster.start(**options)
    try:
        yield made
    finally:
        keep = bool(failed())
        made.stop(purge=not keep)
        if keep:
            print(f"\nSlurm test cluster logs kept in {made.state}/log")
