"""Property-based fuzzing of what reaches root: the three hooks' environments and the CLI's
argv, on the simulator. For any input: the exit code is within the hooks' contract
(slurm/README.md), no traceback reaches the terminal, nothing of the job is left, and nothing
outside run_dir is touched (a sentinel tree beside run_dir is compared before and after).

Bounded and deterministic (``derandomize``): the same examples run in every CI run.
"""

from __future__ import annotations

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

from tests.functional.test_faults import admin_config
from tests.simenv import SimNode, finish_sim_node, make_sim_node
from tests.tree import REPO
from tests.users import ensure_test_user

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
    assert _settled(node), (env, [p.cmdline() for p in node.leftovers()])
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
    assert _settled(node), (argv, [p.cmdline() for p in node.leftovers()])
    assert _snapshot(node.root / "sentinel") == before
