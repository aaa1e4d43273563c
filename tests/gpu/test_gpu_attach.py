"""Issue-15 gpu tier: on the real driver, `mpswrap run` says whether each rank became an MPS
client (a rank that misses its daemon runs without MPS, silently, on the real GPU) and ends
with one summary line for the node."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.users import run_as

from .conftest import base_env, leftovers

pytestmark = pytest.mark.gpu
HERE = Path(__file__).resolve().parent
CLIENT = [sys.executable, str(HERE / "torch_client.py")]
SUMMARY = re.compile(
    r"^mpswrap: summary: node \S+: (?P<ranks>\d+) ranks?, (?P<attached>[^,]+), exit codes "
    r"(?P<codes>[^,]+(?:, \d+ \(\d+\))*), (?P<ended>\d+) ended by terminate_client, teardown "
    r"(?P<teardown>[^,]+), [0-9.]+ s$",
    re.M,
)


def _run(user: str, tmp: Path, *args: str) -> tuple[int, str, str, re.Match[str]]:
    env = base_env({"MPSWRAP_USER_RUN_DIR": str(tmp / "run")})
    res = run_as(user, [sys.executable, "-m", "mpswrap", "run", *args], env, timeout=180)
    print(res.stdout[-3000:], res.stderr[-3000:])
    found = list(SUMMARY.finditer(res.stderr))
    assert len(found) == 1, res.stderr
    return res.returncode, res.stdout, res.stderr, found[0]


def test_run_of_four_torch_clients_sums_up_four_attached(
    gpu_user: str, shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    code, out, err, summary = _run(gpu_user, shared_tmp, "-n", "4", "--", *CLIENT, "--seconds", "6")
    assert out.count("torch-client") == 8, out  # started and done, each rank
    assert code == 0, err
    assert summary["ranks"] == "4" and summary["attached"] == "4 attached", summary[0]
    assert summary["codes"] == "0" and summary["teardown"] == "clean", summary[0]
    assert "not an MPS client" not in err
    assert leftovers(shared_tmp, mps_baseline) == []


@pytest.mark.parametrize(("mode", "expected"), [("warn", 0), ("fail", 69)])
def test_a_rank_without_mps_is_named(
    gpu_user: str,
    shared_tmp: Path,
    mps_baseline: set[tuple[int, float]],
    mode: str,
    expected: int,
) -> None:
    """Its own CUDA_MPS_PIPE_DIRECTORY names no daemon: CUDA runs it without MPS."""
    wrong = ["env", f"CUDA_MPS_PIPE_DIRECTORY={shared_tmp}/no-daemon-here", *CLIENT]
    code, out, err, summary = _run(
        gpu_user,
        shared_tmp,
        "-n",
        "2",
        "--verify-attach",
        mode,
        "--verify-timeout",
        "4",
        "--",
        *wrong,
        "--seconds",
        "12",
    )
    assert code == expected, err
    named = err.count("is not an MPS client")
    assert named == 2 if mode == "warn" else named >= 1, err
    assert summary["attached"] == "0 attached (2 not seen)", summary[0]
    if mode == "warn":  # the ranks ran to the end, without MPS
        assert summary["codes"] == "0" and out.count(" done") == 2, (summary[0], out)
    assert summary["teardown"] == "clean", summary[0]
    assert leftovers(shared_tmp, mps_baseline) == []


PROBE = (
    "import sys, torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize(); "
    "from mpswrap.mps.cuda import mps_client; print('mps_client', mps_client())"
)


def test_the_driver_says_which_process_runs_through_mps(
    gpu_user: str, shared_tmp: Path, mps_baseline: set[tuple[int, float]]
) -> None:
    """CU_DEVICE_ATTRIBUTE_MPS_ENABLED on the real driver: True for a rank of `mpswrap run`,
    False for a process whose pipe directory reaches no daemon (time-sliced)."""
    code, out, _, _ = _run(gpu_user, shared_tmp, "-n", "2", "--", sys.executable, "-c", PROBE)
    assert code == 0 and out.count("mps_client True") == 2, out
    nowhere = shared_tmp / "nowhere"
    nowhere.mkdir(mode=0o777)
    env = base_env({"CUDA_MPS_PIPE_DIRECTORY": str(nowhere)})
    plain = run_as(gpu_user, [sys.executable, "-c", PROBE], env, timeout=180)
    assert plain.returncode == 0 and "mps_client False" in plain.stdout, plain.stdout + plain.stderr
    assert leftovers(shared_tmp, mps_baseline) == []
