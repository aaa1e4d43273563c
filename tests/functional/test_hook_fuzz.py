"""Property-based fuzzing of what reaches root: the three hooks' environments and the CLI's
argv, on the simulator. For any input: the exit code is within the hooks' contract
(slurm/README.md), no traceback reaches the terminal, nothing of the job is left, and nothing
outside run_dir is touched (a sentinel tree beside run_dir is compared before and after).

Bounded and deterministic (``derandomize``): the same examples run in every CI run.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.functional.test_faults import admin_config, take_over_socket
from tests.procs import described
from tests.simenv import SimNode, finish_sim_node, make_sim_node
from tests.tree import REPO
from tests.users import ensure_test_user, run_as, spawn_as

pytestmark = [
    pytest.mark.functional,
    pytest.mark.root,
]

FUZZ = settings(
    max_examples=20,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def node() -> Iterator[SimNode]:
    sim = make_sim_node(gpus=2)
    admin_config(sim)
    sentinel = sim.root / "sentinel"
    (sentinel / "sub").mkdir(parents=True)
    (sentinel / "keep.txt").write_text("root's file beside run_dir\n")
    (sentinel / "sub" / "deep.txt").write_text("deeper\n")
    try:
        yield sim
    finally:
        left = finish_sim_node(sim)
        assert not left, f"left behind: {left}"


def _snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    out = {}
    for path in sorted(root.rglob("*")):
        st = os.lstat(path)
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        out[str(path.relative_to(root))] = (st.st_mode, data)
    return out


def _hook(node: SimNode, hook: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MPSWRAP_", "SLURM", "CUDA"))}
    base.update(MPSWRAP_CONFIG=str(node.root / "mpswrap.conf"), PYTHONPATH=str(REPO))
    base.update(env)
    return subprocess.run(
        [sys.executable, "-m", "mpswrap", hook],
        env=base,
        text=True,
        capture_output=True,
        timeout=120,
    )


def _settled(node: SimNode, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while node.leftovers():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _user() -> pwd.struct_passwd:
    return pwd.getpwnam(ensure_test_user())


# --- the hooks' environment ------------------------------------------------------------------
_ids = st.one_of(
    st.sampled_from(["101", "102", "4294967294", "123_4", "123+0", "7_[1-3]", "0"]),
    st.text(alphabet="0123456789_+-./ x\n", min_size=0, max_size=12),
    st.text(max_size=8),
)
_gpus = st.one_of(
    st.sampled_from(["0", "1", "0,1", "0,0", "1,0,1", "0-1", "5", "", "GPU-5a1d0000"]),
    st.lists(st.integers(min_value=0, max_value=3), max_size=4).map(
        lambda xs: ",".join(map(str, xs))
    ),
    st.text(alphabet="0123456789,-x ", max_size=8),
)


@st.composite
def hook_env(draw: st.DrawFn) -> dict[str, str]:
    user = _user()
    env = {"SLURMD_NODENAME": "n1", "SLURM_CONF": "/nonexistent/slurm.conf"}
    optional = {
        "SLURM_JOB_ID": _ids,
        "SLURM_JOB_UID": st.sampled_from([str(user.pw_uid), "0", "abc", "", "99999"]),
        "SLURM_JOB_GID": st.sampled_from([str(user.pw_gid), "x", ""]),
        "SLURM_JOB_USER": st.sampled_from([user.pw_name, "root", "nobody", ""]),
        "SLURM_JOB_GPUS": _gpus,
        "SLURM_STEP_GPUS": _gpus,
        "SLURM_STEP_ID": st.sampled_from(["0", "1", "batch", "extern", "x", ""]),
        "SLURM_LOCALID": st.sampled_from(["0", "1", "-1", "x"]),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": st.sampled_from(["50", "100", "0", "abc", ""]),
    }
    for name, values in optional.items():
        if draw(st.booleans()):
            env[name] = draw(values)
    return env


@FUZZ
@given(env=hook_env())
def test_any_hook_environment_keeps_the_contract(node: SimNode, env: dict[str, str]) -> None:
    before = _snapshot(node.root / "sentinel")
    runs = {hook: _hook(node, hook, env) for hook in ("prolog", "task-prolog", "epilog")}
    for hook, res in runs.items():
        assert "Traceback" not in res.stderr, (hook, env, res.stderr)
        # prolog_failure = continue and epilog_failure = drain (the defaults): only the epilog
        # may exit 1, and only when something of the job survived, which must never happen.
        assert res.returncode == 0, (hook, env, res.returncode, res.stderr)
    exports = runs["task-prolog"].stdout.splitlines()
    assert all(line.startswith("export ") for line in exports), exports
    assert _settled(node), (env, [described(p) for p in node.leftovers()])
    node_dir = node.run_dir / "n1"
    assert not node_dir.exists() or not any(p for p in node_dir.iterdir() if p.is_dir()), (
        env,
        sorted(map(str, node_dir.rglob("*"))),
    )
    assert _snapshot(node.root / "sentinel") == before


# --- the CLI's argv ----------------------------------------------------------------------------
_words = st.sampled_from(
    [
        "status",
        "stop",
        "start",
        "run",
        "demo",
        "--job",
        "--node",
        "--json",
        "--gpus",
        "-n",
        "--",
        "true",
        "false",
        "-v",
        "-q",
        "--debug",
        "--help",
        "--version",
        "0",
        "1",
        "0,1",
        "j1",
        "n1",
        "-1",
        "x",
        "",
        "--grace",
        "--bogus",
        "=",
        "../..",
        "/etc",
    ]
)


@FUZZ
@given(argv=st.lists(st.one_of(_words, st.text(max_size=6)), max_size=6))
def test_any_cli_argv_gives_an_exit_code_and_no_traceback(node: SimNode, argv: list[str]) -> None:
    if "demo" in argv:
        argv = [a for a in argv if a != "demo"]  # the demo is tested on its own
    before = _snapshot(node.root / "sentinel")
    res = node.mpswrap(*argv, timeout=120)
    # 0, 1 (failed; also `false`'s own status), 2 (usage), 3/4 (status: unhealthy, none),
    # 126/127 (program cannot run).
    assert res.returncode in (0, 1, 2, 3, 4, 126, 127), (argv, res.returncode, res.stderr)
    if "--debug" not in argv:  # asked for: the debug log is the terminal then
        assert "Traceback" not in res.stderr, (argv, res.stderr)
    node.mpswrap("stop", timeout=120)  # whatever a start started
    # A rank's owner watchdog notices within a few seconds that its job is over.
    assert _settled(node), (argv, [described(p) for p in node.leftovers()])
    assert _snapshot(node.root / "sentinel") == before


# --- the job's files, as its user writes them ---------------------------------------------------
_JOB_FILES = {
    "manifest": "g0/manifest.json",
    "pid file": "g0/pipe/nvidia-cuda-mps-control.pid",
    "control.log": "g0/log/control.log",
    "server.log": "g0/log/server.log",
}
_json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**30), max_value=10**30),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
_digits = st.sampled_from(["²", "٣٣", "9" * 5000, "-1", "0", "4194305", "1e400", "12\x00"])
_pathological = st.sampled_from(
    ["[" + " " * 20000, "[" * 5000, "\x1b[2J" * 100, "\udcff" * 10, "NEW CLIENT " + "9" * 5000]
)


#: A control socket the job's user puts in place of the daemon's: every answer ``delay``
#: seconds late, listing ``count`` process IDs (or, ``junk``, bytes that are none).
_FAKE_SOCKET = """
import json, os, socket, sys, time
path, delay, count, junk = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.unlink(path)
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
listener.listen(64)
while True:
    conn, _ = listener.accept()
    conn.recv(65536)
    time.sleep(delay)
    pids = "\\n".join(str(4000000 + i) for i in range(count))
    out = "\\x1b[2J\\xff" * count if junk == "1" else pids
    conn.sendall(json.dumps({"stdout": out, "stderr": "", "rc": 0}).encode() + b"\\n")
    conn.close()
"""


@st.composite
def job_file(draw: st.DrawFn) -> tuple[str, str]:
    """(which job file, what its user writes there): a manifest with fields of any type, a
    number ``isdigit`` takes and ``int`` refuses, a line that costs a backtracking parser
    quadratic time, escape sequences; or a control socket of theirs, slow and lying."""
    name = draw(st.sampled_from([*_JOB_FILES, "control socket"]))
    if name == "control socket":
        delay = draw(st.sampled_from(["0", "0.3", "1.0"]))
        count = draw(st.sampled_from(["0", "60", "5000"]))
        return name, f"{delay} {count} {draw(st.sampled_from(['0', '1']))}"
    if name == "manifest":
        fields = draw(
            st.dictionaries(
                st.sampled_from(["daemon_pid", "daemon_start_time", "servers", "uid", "version"]),
                _json_values | _digits,
                min_size=1,
            )
        )
        return name, json.dumps({"version": 1, **fields})
    lines = draw(st.lists(_digits | _pathological | st.text(max_size=40), min_size=1, max_size=4))
    header = "[2026-11-27 10:00:00.000 Control {}] Starting new server {} for user 0"
    return name, "\n".join(header.format(w, w) if i % 2 else w for i, w in enumerate(lines))


@FUZZ
@given(case=job_file())
def test_any_job_file_keeps_the_epilogs_contract(node: SimNode, case: tuple[str, str]) -> None:
    """Whatever the job's user writes into a file of its job's directories, the epilog ends
    the job's daemons from root's record, exits 0 and leaves nothing; root's status answers."""
    name, text = case
    env = {
        "SLURM_JOB_ID": "301",
        "SLURM_JOB_UID": str(_user().pw_uid),
        "SLURM_JOB_GID": str(_user().pw_gid),
        "SLURM_JOB_USER": _user().pw_name,
        "SLURM_JOB_GPUS": "0,1",
        "SLURMD_NODENAME": "n1",
        "SLURM_CONF": "/nonexistent/slurm.conf",
    }
    assert _hook(node, "prolog", env).returncode == 0
    fake = _plant(node, name, text)
    try:
        conf = str(node.root / "mpswrap.conf")
        status = node.mpswrap("status", "--node", "n1", MPSWRAP_CONFIG=conf, timeout=120)
        assert status.returncode in (0, 3) and "Traceback" not in status.stderr, status.stderr
        assert "\x1b" not in status.stdout
        end = _hook(node, "epilog", env)
    finally:
        if fake is not None:
            fake.kill()
            fake.communicate(timeout=30)
    assert end.returncode == 0 and "Traceback" not in end.stderr, (name, end.stderr)
    assert "internal error" not in end.stderr, end.stderr
    assert _settled(node), (name, [described(p) for p in node.leftovers()])
    assert not (node.run_dir / "n1" / "301").exists()


def _plant(node: SimNode, name: str, text: str) -> subprocess.Popen[str] | None:
    """As the job's user: write ``text`` into the job file ``name``, or put a fake control
    socket in place of the daemon's (the process serving it, returned)."""
    job = node.run_dir / "n1" / "301"
    if name == "control socket":
        script = node.root / "fake_socket.py"
        script.write_text(_FAKE_SOCKET)
        script.chmod(0o644)
        control = job / "g0" / "pipe" / "control"
        real = control.stat().st_ino
        fake = spawn_as(
            _user().pw_name, ["/usr/bin/python3", str(script), str(control), *text.split()]
        )
        deadline = time.monotonic() + 30
        while not (control.is_socket() and control.stat().st_ino != real):
            assert time.monotonic() < deadline, "the fake socket did not come up"
            time.sleep(0.05)
        take_over_socket(node, "301", control)
        return fake
    source = node.root / "planted"
    source.write_bytes(text.encode("utf-8", "surrogateescape"))
    source.chmod(0o644)
    planted = run_as(_user().pw_name, ["sh", "-c", f"cat {source} > {job / _JOB_FILES[name]}"])
    assert planted.returncode == 0, planted.stderr
    return None
