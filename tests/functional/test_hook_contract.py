"""The hooks' exit-code contract (slurm/README.md, "Exit codes"), driven as slurmd drives them.

Each hook runs through the shim (mpswrap/slurm/hook) installed as install.sh would, with the
environment slurmd gives it: root's for the prolog and epilog, the job user's for the task
prolog (a real second user), on the simulator. The table is read from the README and every
test names the row it checks (``expect``), so the two cannot drift apart; a test checks that
each row is named here. The shims run this tree's mpswrap through a test interpreter, because
the shim's ``-I`` hides PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpswrap import _lock
from mpswrap.errors import LockTimeout, MpswrapError
from tests.functional.test_faults import admin_config, admin_job, daemons_of, gone, manifests
from tests.procs import described
from tests.simenv import SimNode
from tests.tree import PACKAGE, REPO
from tests.users import ensure_test_user, run_as

pytestmark = [
    pytest.mark.functional,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root and as the job user"),
]
README = REPO / "slurm" / "README.md"
HOOK_NAMES = {"prolog": "prolog", "task prolog": "task_prolog", "epilog": "epilog"}


def read_contract() -> dict[str, tuple[str, int]]:
    """case -> (hook, exit code), from the table under "## Exit codes"."""
    section = README.read_text().split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(
        r"^\| `([a-z-]+)` \| ([a-z ]+) \| [^\n]* \| (\d) \| [^|\n]* \|$", section, re.M
    )
    return {case: (hook, int(code)) for case, hook, code in rows}


CONTRACT = read_contract()


def expect(case: str, shim: str, res: subprocess.CompletedProcess[str]) -> None:
    """``res`` is the run of ``shim`` that the README's row ``case`` describes."""
    hook, code = CONTRACT[case]
    assert HOOK_NAMES[hook] == shim, (case, shim)
    assert res.returncode == code, f"{case}: exit {res.returncode}\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.splitlines()
    assert all(ln.startswith(f"mpswrap: {shim.replace('_', '-')}: ") for ln in lines), lines
    exports = res.stdout.splitlines()
    assert all(ln.startswith("export ") for ln in exports), exports
    # Every task learns where the admin file is (not at the default path in these tests).
    exports = [ln for ln in exports if not ln.startswith("export MPSWRAP_CONFIG=")]
    assert bool(exports) == (case == "task-exports"), (case, exports)


# --- running the hooks as slurmd does --------------------------------------------------------
#: -P (3.11+): no script directory on sys.path, as -I gives the real shim.
SAFE_PATH = "-P" if sys.version_info >= (3, 11) else ""


def install_shims(
    node: SimNode,
    name: str = "hooks",
    pythonpath: str = str(PACKAGE.parent),
    python: str | None = None,
) -> Path:
    """mpswrap/slurm/hook as install.sh installs it, on an interpreter that runs the mpswrap
    of ``pythonpath``'s first directory (the one under test by default), or on ``python``."""
    dest = node.root / name
    dest.mkdir(mode=0o755)
    if python is None:
        wrapper = dest / "python"
        wrapper.write_text(
            "#!/bin/sh\n# The shim's -I would hide PYTHONPATH: run this tree's mpswrap instead.\n"
            '[ "$1" = -I ] || exit 99\nshift\n'
            f'PYTHONPATH={pythonpath} exec {sys.executable} {SAFE_PATH} "$@"\n'
        )
        wrapper.chmod(0o755)
        python = str(wrapper)
    package = Path(pythonpath.split(os.pathsep, maxsplit=1)[0]) / "mpswrap"  # what the shim imports
    source = (package / "slurm" / "hook").read_text()
    source = source.replace("@PYTHON@", python).replace("@CONFIG@", str(conf(node)))
    levels = {str(p) for f in (python, os.path.realpath(python), package) for p in _levels(f)}
    source = source.replace("@PACKAGE@", str(package)).replace("@TRUSTED@", " ".join(levels))
    for shim in (dest / n for n in HOOK_NAMES.values()):
        shim.write_text(source)
        shim.chmod(0o755)
    return dest


def _levels(path: str | Path) -> list[Path]:
    """``path`` and every directory above it, as install.sh lists them for the shim."""
    return [Path(path), *Path(path).parents]


def conf(node: SimNode) -> Path:
    return node.root / "mpswrap.conf"


def run(
    shim: Path, env: dict[str, str], user: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The shim with exactly ``env``, as root or as ``user``."""
    if user:
        return run_as(user, [str(shim)], env, cwd="/")
    return subprocess.run(
        [str(shim)], env=env, cwd="/", text=True, capture_output=True, timeout=120, check=False
    )


def slurmd_env(node: SimNode, context: str, **extra: str | None) -> dict[str, str]:
    """What slurmd gives the prolog or epilog of job 101 of the test user on node n1."""
    entry = pwd.getpwnam(ensure_test_user())
    env = {
        "SLURM_JOB_ID": "101",
        "SLURM_JOB_UID": str(entry.pw_uid),
        "SLURM_JOB_GID": str(entry.pw_gid),
        "SLURM_JOB_USER": entry.pw_name,
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_GPUS": "0,1",
        "SLURM_SCRIPT_CONTEXT": f"{context}_slurmd",
        "SLURM_CONF": str(node.root / "slurm.conf"),
        **extra,
    }
    return {k: v for k, v in env.items() if v is not None}


def task_env(node: SimNode, **extra: str | None) -> dict[str, str]:
    """What slurmstepd gives the task prolog of task 0 of step 0 of job 101."""
    entry = pwd.getpwnam(ensure_test_user())
    env = {
        "SLURM_JOB_ID": "101",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_GPUS": "0,1",
        "SLURM_LOCALID": "0",
        "SLURM_STEP_TASKS_PER_NODE": "1",
        "SLURMD_NODENAME": "n1",
        "SLURM_CONF": str(node.root / "slurm.conf"),
        "HOME": entry.pw_dir,
        "USER": entry.pw_name,
        **extra,
    }
    return {k: v for k, v in env.items() if v is not None}


@pytest.fixture
def hooks(node: SimNode) -> Path:
    admin_config(node)
    # A slurm.conf scontrol rejects at once: no controller to wait for (it retries 60 s).
    (node.root / "slurm.conf").write_text("not a slurm.conf\n")
    return install_shims(node)


def start(node: SimNode, hooks: Path, gpus: str = "0,1") -> None:
    res = run(hooks / "prolog", slurmd_env(node, "prolog", SLURM_JOB_GPUS=gpus))
    expect("prolog-started", "prolog", res)


def end(node: SimNode, hooks: Path) -> None:
    expect("epilog-clean", "epilog", run(hooks / "epilog", slurmd_env(node, "epilog")))
    assert not admin_job(node).exists()
    assert not node.leftovers(), [described(p) for p in node.leftovers()]


# --- the table -------------------------------------------------------------------------------
def test_the_table_has_every_case_once_and_each_is_checked_here() -> None:
    assert CONTRACT, "no exit-code table in slurm/README.md"
    assert {hook for hook, _ in CONTRACT.values()} == set(HOOK_NAMES)
    assert all(code in (0, 1) for _, code in CONTRACT.values())
    source = Path(__file__).read_text()
    assert not [case for case in CONTRACT if f'"{case}"' not in source]
    # Only a drain policy ever makes a root hook fail; the task prolog never fails.
    assert {c for c, (_, code) in CONTRACT.items() if code} == {
        "prolog-failed-drain",
        "epilog-left-drain",
    }


# --- prolog ----------------------------------------------------------------------------------
@pytest.mark.parametrize("gpus", ["0,0,1,1", "1,0-1,0"])
def test_a_gpu_named_twice_gets_one_daemon_in_seconds(
    node: SimNode, hooks: Path, gpus: str
) -> None:
    began = time.monotonic()
    start(node, hooks, gpus)
    took = time.monotonic() - began
    assert took < 10, f"{took:.1f} s: waited on a lock of its own?"
    assert sorted(manifests(admin_job(node))) == ["g0", "g1"]
    for key in ("g0", "g1"):
        assert len(daemons_of(node.layout("101", admin=True).gpu(key).pipe)) == 1, key
    end(node, hooks)


@pytest.mark.parametrize("mode", ["never", "opt-in"])
def test_a_job_that_wants_no_mps_gets_nothing_even_under_drain(
    node: SimNode, hooks: Path, mode: str
) -> None:
    admin_config(node, prolog_failure="drain", prolog_mode=mode)
    # A list it never needs to read (and an opt-in trigger it does not match).
    env = slurmd_env(
        node, "prolog", SLURM_JOB_GPUS="0,x", SLURM_JOB_COMMENT="", SLURM_JOB_CONSTRAINTS=""
    )
    res = run(hooks / "prolog", env)
    expect("prolog-unwanted", "prolog", res)
    assert (res.stdout, res.stderr) == ("", "")
    assert not admin_job(node).exists()


def test_a_user_name_that_is_not_the_uids_is_refused(node: SimNode, hooks: Path) -> None:
    res = run(hooks / "prolog", slurmd_env(node, "prolog", SLURM_JOB_USER="root"))
    expect("prolog-failed-continue", "prolog", res)
    uid = pwd.getpwnam(ensure_test_user()).pw_uid
    assert res.stderr.splitlines() == [
        f"mpswrap: prolog: job 101 node n1: SLURM_JOB_USER and SLURM_JOB_UID disagree ('root', "
        f"uid {uid} is '{ensure_test_user()}')",
        "mpswrap: prolog: job 101 node n1: continuing without MPS (prolog_failure = continue)",
    ]
    assert not admin_job(node).exists()


def test_under_drain_the_reason_is_mpswrap_prolog_and_the_cause(node: SimNode, hooks: Path) -> None:
    admin_config(node, prolog_failure="drain")
    res = run(hooks / "prolog", slurmd_env(node, "prolog", SLURM_JOB_GPUS="5"))
    expect("prolog-failed-drain", "prolog", res)
    cause = "Slurm GPU position not in gres.conf (position 5): gres.conf lists 2 GPU(s) for n1"
    first, second = res.stderr.splitlines()
    assert first == f"mpswrap: prolog: job 101 node n1: {cause}"
    # No slurmctld here, so scontrol fails: the reason it was given shows in the warning.
    assert f"could not set the drain reason 'mpswrap prolog: {cause}'" in second, second
    assert not admin_job(node).exists()


@pytest.mark.parametrize(
    ("policy", "case"), [("continue", "prolog-failed-continue"), ("drain", "prolog-failed-drain")]
)
def test_a_lock_held_elsewhere_is_one_line_within_its_timeout(
    node: SimNode, hooks: Path, policy: str, case: str
) -> None:
    admin_config(node, prolog_failure=policy, start_timeout="1")  # locks wait 4 x 1 s
    with root_lock(node, "g0") as held:  # another root hook starting or stopping GPU 0
        began = time.monotonic()
        res = run(hooks / "prolog", slurmd_env(node, "prolog"))
        took = time.monotonic() - began
    expect(case, "prolog", res)
    line = f"mpswrap: prolog: job 101 node n1: lock busy ({held.path}): another hook held it"
    assert res.stderr.splitlines()[0].startswith(line), res.stderr
    assert took < 30, took
    end(node, hooks)


def root_lock(node: SimNode, key: str) -> _lock.RootLock:
    """Root's start/stop lock of GPU ``key`` of job 101 on n1, as another root hook takes it:
    in run_dir's root-only ``.locks``, never in the job user's directory."""
    path = node.run_dir / ".locks" / f"n1.101.{key}.lock"
    return _lock.RootLock(path, 1, lambda: path.parent.mkdir(parents=True, exist_ok=True))


# --- task prolog -----------------------------------------------------------------------------
def test_a_task_of_a_real_step_gets_its_exports_and_the_batch_step_none(
    node: SimNode, hooks: Path
) -> None:
    start(node, hooks)
    user = ensure_test_user()
    res = run(hooks / "task_prolog", task_env(node), user=user)
    expect("task-exports", "task_prolog", res)
    found = dict(ln.removeprefix("export ").split("=", 1) for ln in res.stdout.splitlines())
    assert found["CUDA_MPS_PIPE_DIRECTORY"] == str(node.layout("101", admin=True).gpu("g0").pipe)
    # A step GPU named by its UUID (as gres.conf UniqueId makes Slurm write) finds it too.
    uuid = str(manifests(admin_job(node))["g1"]["gpu_uuid"])
    res = run(hooks / "task_prolog", task_env(node, SLURM_STEP_GPUS=uuid), user=user)
    expect("task-exports", "task_prolog", res)
    assert f"export CUDA_VISIBLE_DEVICES={uuid}" in res.stdout.splitlines()
    batch = run(hooks / "task_prolog", task_env(node, SLURM_STEP_ID="batch"), user=user)
    expect("task-other", "task_prolog", batch)
    assert batch.stderr == ""
    end(node, hooks)


def test_every_task_learns_where_the_admin_file_is_and_status_in_the_job_finds_it(
    node: SimNode, hooks: Path
) -> None:
    """The admin file is not at the default path: a task of a real step and the batch step
    both get the path root's shim names (never the job user's own MPSWRAP_CONFIG), and with
    it the job user's ``mpswrap status`` finds the prolog's daemons; without it, none."""
    start(node, hooks)
    user = ensure_test_user()
    line = f"export MPSWRAP_CONFIG={conf(node)}"
    theirs = task_env(node, SLURM_STEP_ID="batch", MPSWRAP_CONFIG="/home/theirs/mpswrap.conf")
    for env in (task_env(node), theirs):
        res = run(hooks / "task_prolog", env, user=user)
        assert res.returncode == 0 and line in res.stdout.splitlines(), res.stdout + res.stderr
    python = [sys.executable, *([SAFE_PATH] if SAFE_PATH else [])]
    status = [*python, "-m", "mpswrap", "status", "--json", "--node", "n1", "--job", "101"]
    job_env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PACKAGE.parent), "HOME": "/"}
    found = run_as(user, status, {**job_env, "MPSWRAP_CONFIG": str(conf(node))}, cwd="/")
    assert found.returncode == 0, found.stdout + found.stderr
    assert str(admin_job(node)) in found.stdout, found.stdout
    assert run_as(user, status, job_env, cwd="/").returncode == 4
    end(node, hooks)


@pytest.mark.parametrize("fault", ["unreadable", "bad value", "missing"])
def test_a_bad_admin_file_gives_no_export_and_one_line(
    node: SimNode, hooks: Path, fault: str
) -> None:
    start(node, hooks)
    text = conf(node).read_text()
    if fault == "unreadable":
        conf(node).chmod(0o600)  # root's alone: the job user cannot read it
        cause = f"cannot read config file ({conf(node)}): Permission denied"
    elif fault == "bad value":
        conf(node).write_text(text + "gpu_policy = random\n")
        cause = f"bad value for gpu_policy ('random' in {conf(node)}): expected one of block"
    else:
        conf(node).unlink()
        cause = f"cannot read config file ({conf(node)}): No such file or directory"
    res = run(hooks / "task_prolog", task_env(node), user=ensure_test_user())
    expect("task-other", "task_prolog", res)
    assert len(res.stderr.splitlines()) == 1, res.stderr
    assert res.stderr.startswith(f"mpswrap: task-prolog: job 101 node n1: {cause}"), res.stderr
    if fault == "bad value":  # the epilog tears down with the default for that setting
        res = run(hooks / "epilog", slurmd_env(node, "epilog"))
        expect("epilog-clean", "epilog", res)
        assert "(its default is used)" in res.stderr
    conf(node).write_text(text)
    conf(node).chmod(0o644)
    end(node, hooks)


# --- epilog ----------------------------------------------------------------------------------
@pytest.mark.parametrize("job", [None, "", "a/b", "..", "x" * 65, "1\n2", "123+0"], ids=repr)
def test_an_epilog_without_a_job_id_has_nothing_to_find(
    node: SimNode, hooks: Path, job: str | None
) -> None:
    start(node, hooks)  # another job's daemons: they must stay
    res = run(hooks / "epilog", slurmd_env(node, "epilog", SLURM_JOB_ID=job))
    expect("epilog-no-job", "epilog", res)
    (line,) = res.stderr.splitlines()
    assert line.endswith(": nothing of a job to tear down"), line
    assert sorted(manifests(admin_job(node))) == ["g0", "g1"]
    end(node, hooks)


@pytest.mark.parametrize("policy", ["drain", "continue"])
def test_a_gpu_whose_lock_is_held_elsewhere_is_still_ended_by_its_cgroup(
    node: SimNode, hooks: Path, policy: str
) -> None:
    """Another root hook holds g0's lock past its bound: the epilog's ladder for g0 fails,
    and g0's daemon is ended by root's cgroup all the same (a warning names the lock), its
    directory and record go, and the epilog exits 0 under either policy: nothing survives."""
    start(node, hooks)
    pids = [int(m["daemon_pid"]) for m in manifests(admin_job(node)).values()]
    admin_config(node, epilog_failure=policy, start_timeout="1")  # locks wait 4 x 1 s
    with root_lock(node, "g0") as held:  # another root hook's
        res = run(hooks / "epilog", slurmd_env(node, "epilog"))
    expect("epilog-clean", "epilog", res)
    (line,) = [ln for ln in res.stderr.splitlines() if "teardown failed" in ln]
    assert f"lock busy ({held.path})" in line, res.stderr
    assert all(gone(pid) for pid in pids)
    assert not admin_job(node).exists()
    end(node, hooks)


# --- the shim alone -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shim", "policy", "case"),
    [
        ("prolog", "continue", "prolog-failed-continue"),
        ("prolog", "drain", "prolog-failed-drain"),
        ("task_prolog", "continue", "task-other"),
        ("epilog", "drain", "epilog-left-drain"),  # teardown did not run
        ("epilog", "continue", "epilog-left-continue"),
    ],
)
def test_without_an_interpreter_the_shim_keeps_the_contract(
    node: SimNode, hooks: Path, shim: str, policy: str, case: str
) -> None:
    admin_config(node, prolog_failure=policy, epilog_failure=policy)
    broken = install_shims(node, "no-python", python=str(node.root / "absent" / "python"))
    if shim == "task_prolog":
        res = run(broken / shim, task_env(node), user=ensure_test_user())
    else:
        res = run(broken / shim, slurmd_env(node, shim))
    expect(case, shim, res)
    assert res.stderr.endswith("is not executable (run mpswrap install-hooks)\n"), res.stderr


# --- errors nobody expected ------------------------------------------------------------------
def inject(node: SimNode, target: str) -> str:
    """A PYTHONPATH whose sitecustomize makes ``module:attribute`` raise ZeroDivisionError."""
    where = node.root / f"inject-{target.replace(':', '-')}"
    where.mkdir(mode=0o755)
    module, attribute = target.split(":")
    (where / "sitecustomize.py").write_text(
        "import importlib\n\n\ndef boom(*args, **kwargs):\n"
        "    raise ZeroDivisionError('injected')\n\n\n"
        f"setattr(importlib.import_module({module!r}), {attribute!r}, boom)\n"
    )
    os.chmod(where / "sitecustomize.py", 0o644)
    return f"{PACKAGE.parent}:{where}"


@pytest.mark.parametrize("level", ["info", "debug"])
def test_an_unexpected_error_in_a_hook_is_one_line_and_a_traceback_only_at_debug(
    node: SimNode, hooks: Path, level: str
) -> None:
    admin_config(node, log_level=level)
    broken = install_shims(node, "broken", inject(node, "mpswrap.entry.hooks:resolve_slurm_gpus"))
    res = run(broken / "prolog", slurmd_env(node, "prolog"))
    if level == "info":
        expect("prolog-failed-continue", "prolog", res)
    line = (
        "mpswrap: prolog: job 101 node n1: internal error: ZeroDivisionError: injected "
        "(traceback at log_level = debug)"
    )
    assert line in res.stderr.splitlines(), res.stderr
    assert ("Traceback (most recent call last)" in res.stderr) == (level == "debug")
    assert all(ln.startswith("mpswrap: prolog: ") for ln in res.stderr.splitlines())
    assert res.returncode == 0


def test_an_unexpected_error_in_the_task_prolog_and_epilog_is_one_line(
    node: SimNode, hooks: Path
) -> None:
    start(node, hooks)
    broken = install_shims(node, "broken", inject(node, "mpswrap.job.state:admin_layout"))
    res = run(broken / "task_prolog", task_env(node), user=ensure_test_user())
    expect("task-other", "task_prolog", res)
    assert res.stderr == (
        "mpswrap: task-prolog: job 101 node n1: internal error: ZeroDivisionError: injected "
        "(traceback at log_level = debug)\n"
    )
    broken_end = install_shims(node, "broken-end", inject(node, "mpswrap.job.state:job_layouts"))
    res = run(broken_end / "epilog", slurmd_env(node, "epilog"))
    # Teardown did not run: the job's daemons survive, and epilog_failure = drain says so.
    expect("epilog-left-drain", "epilog", res)
    assert "internal error: ZeroDivisionError: injected" in res.stderr
    end(node, hooks)


def test_an_unexpected_error_in_the_cli_is_one_line_and_a_traceback_with_debug(
    node: SimNode,
) -> None:
    env = node.env(PYTHONPATH=inject(node, "mpswrap.config:load_settings"))
    argv = [sys.executable, "-m", "mpswrap", "status", "--job", "j1", "--node", "n1"]
    res = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=60, check=False)
    assert (res.returncode, res.stderr) == (
        1,
        "mpswrap: internal error: ZeroDivisionError: injected (traceback with --debug)\n",
    )
    res = subprocess.run(
        [*argv, "--debug"], env=env, text=True, capture_output=True, timeout=60, check=False
    )
    assert "Traceback (most recent call last)" in res.stderr, res.stderr
    assert res.stderr.endswith("(traceback with --debug)\n"), res.stderr


def test_a_filelock_timeout_is_a_one_line_mpswrap_error(tmp_path: Path) -> None:
    path = tmp_path / "g0.lock"
    with _lock.file_lock(path, timeout=5):
        other = _lock.file_lock(path, timeout=0.2)  # a second object excludes like a process
        with pytest.raises(LockTimeout) as caught:
            other.acquire()
    assert isinstance(caught.value, MpswrapError) and isinstance(caught.value, TimeoutError)
    assert caught.value.line() == f"lock busy ({path}): another process held it for 0.2 s"
    assert type(caught.value.__cause__).__module__.startswith("filelock")


@pytest.mark.parametrize(("policy", "share"), [("40", "40"), ("nan:1", None), ("1:inf", None)])
def test_a_policy_that_reaches_the_prolog_without_the_plugin_never_fails_the_job(
    node: SimNode, hooks: Path, policy: str, share: str | None
) -> None:
    """``SPANK_MPSWRAP_MPS`` comes from the plugin, which refuses bad policies, but anyone may
    submit through another client: a bad one is one warning line, the daemons start as for
    a plain ``--mps``, and the job user's tasks get no share; a good one reaches each task."""
    env = slurmd_env(node, "prolog", SPANK_MPSWRAP_MPS=policy)
    res = run(hooks / "prolog", env)
    expect("prolog-started", "prolog", res)
    assert ("the tasks get no thread limit" in res.stderr) is (share is None), res.stderr
    task = run(hooks / "task_prolog", task_env(node), user=ensure_test_user())
    expect("task-exports", "task_prolog", task)
    found = dict(ln.removeprefix("export ").split("=", 1) for ln in task.stdout.splitlines())
    assert found.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == share, found
    end(node, hooks)


@pytest.mark.parametrize("level", ["interpreter", "package file", "package directory"])
def test_the_shim_runs_no_interpreter_or_package_another_user_can_change(
    node: SimNode, level: str
) -> None:
    """install.sh checked them; a mode or owner changed after it is caught on every prolog and
    epilog, before root runs anything of them: one line naming the level, and the contract."""
    admin_config(node, prolog_failure="continue", epilog_failure="drain")
    site = node.root / "site"
    shutil.copytree(PACKAGE, site / "mpswrap", ignore=shutil.ignore_patterns("__pycache__"))
    hooks = install_shims(node, pythonpath=str(site))
    changed = {
        "interpreter": hooks / "python",
        "package file": site / "mpswrap" / "config.py",
        "package directory": site / "mpswrap" / "mps",
    }[level]
    os.chown(changed, pwd.getpwnam(ensure_test_user()).pw_uid, -1)
    for shim, case in (("prolog", "prolog-failed-continue"), ("epilog", "epilog-left-drain")):
        res = run(hooks / shim, slurmd_env(node, shim))
        expect(case, shim, res)
        assert res.stderr.splitlines() == [
            f"mpswrap: {shim}: not running {hooks / 'python'} as root: a user other than root "
            f"can change {changed} (fix it, then run mpswrap install-hooks)"
        ], res.stderr
    assert not admin_job(node).exists()


def test_a_task_of_several_gpus_gets_no_exports_and_one_line(node: SimNode, hooks: Path) -> None:
    """``srun --gpus-per-task=2``: the prolog's daemons serve one GPU each, and no one of them
    serves a task that uses two: the task runs as Slurm set it up (both GPUs, no MPS), and one
    line says how to give it one daemon over both."""
    start(node, hooks)
    task = run(
        hooks / "task_prolog", task_env(node, SLURM_GPUS_PER_TASK="2"), user=ensure_test_user()
    )
    expect("task-other", "task_prolog", task)
    assert "CUDA_MPS_PIPE_DIRECTORY" not in task.stdout, task.stdout
    assert "a task of 2 GPUs runs without MPS" in task.stderr, task.stderr
    assert "--gpus-per-rank 2" in task.stderr
    end(node, hooks)


def test_gpu_uuids_in_cuda_visible_devices_name_the_jobs_and_the_steps_gpus(
    node: SimNode, hooks: Path
) -> None:
    """Slurm 26.05's ``gres.conf Flags=env_uuid``: ``CUDA_VISIBLE_DEVICES`` holds GPU UUIDs.
    The prolog starts a daemon for each UUID named (no ``SLURM_JOB_GPUS``), and a task of a
    step whose only word for its GPU is its UUID is attached to that GPU's daemon."""
    inventory = json.loads(node.inventory.read_text())["gpus"]
    uuids = [g["uuid"] for g in inventory]
    prolog = slurmd_env(node, "prolog", SLURM_JOB_GPUS=None, CUDA_VISIBLE_DEVICES=",".join(uuids))
    expect("prolog-started", "prolog", run(hooks / "prolog", prolog))
    assert sorted(m["gpu_uuid"] for m in manifests(admin_job(node)).values()) == sorted(uuids)
    for uuid in uuids:
        env = task_env(node, SLURM_STEP_GPUS=None, CUDA_VISIBLE_DEVICES=uuid)
        task = run(hooks / "task_prolog", env, user=ensure_test_user())
        expect("task-exports", "task_prolog", task)
        found = dict(ln.removeprefix("export ").split("=", 1) for ln in task.stdout.splitlines())
        assert found["CUDA_VISIBLE_DEVICES"] == uuid, found
        key = Path(found["CUDA_MPS_PIPE_DIRECTORY"]).parent.name
        assert manifests(admin_job(node))[key]["gpu_uuid"] == uuid
    end(node, hooks)
