"""Every command gives the exit codes its row of the command table names (``--help``, the man
page and docs/reference.md show them), and each of them is produced here by a real run on a
simulated node; the hooks' codes are their contract with slurmd (slurm/README.md), whose
every case tests/functional/test_hook_contract.py runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest

from mpswrap.cli.commands import COMMANDS, HOOKS, command_named
from mpswrap.errors import EXIT_CODES
from tests.functional.test_hook_contract import CONTRACT
from tests.simenv import SimNode

pytestmark = [
    pytest.mark.functional,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="install-hooks and a lost daemon need root"),
]

JOB = ("--job", "j1", "--node", "n1")
NO_CONTROL = {"MPSWRAP_CONTROL_BINARY": "no-mps-control"}  # found nowhere: the node lacks it
#: A case: what to set up on the node (the words it returns are appended), the argv, the env.
Setup = Callable[[SimNode], list[str]]


def _none(node: SimNode) -> list[str]:
    return []


def _file(text: str, name: str = "tasks.txt") -> Setup:
    def setup(node: SimNode) -> list[str]:
        (node.root / name).write_text(text)
        return [str(node.root / name)]

    return setup


def _in_node(name: str) -> Setup:
    return lambda node: [str(node.root / name)]


def _started(node: SimNode) -> list[str]:
    res = node.mpswrap("start", "--gpus", "0", *JOB)
    assert res.returncode == 0, res
    return []


def _lost_daemon(node: SimNode) -> list[str]:
    res = node.mpswrap("start", "--gpus", "0", *JOB)
    assert res.returncode == 0, res
    os.kill(int(re.search(r"daemon (\d+)", res.stdout)[1]), signal.SIGKILL)  # type: ignore[index]
    return []


def _kept_by_a_mount(node: SimNode) -> list[str]:
    """A started daemon whose log directory is a mount point: the teardown cannot remove it
    (EBUSY), and says so (``_unmount`` ends the mount after the case)."""
    _started(node)
    log_dir = node.layout("j1").gpu("g0").log
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "none", str(log_dir)], check=True)
    return []


def _unmount(node: SimNode) -> None:
    """Every mount below the node's root, undone (the innermost first)."""
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        points = [line.split()[1] for line in mounts if f" {node.root}/" in line]
    for point in sorted(points, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)


def _archived(node: SimNode) -> list[str]:
    _started(node)
    assert node.mpswrap("stop", *JOB, timeout=60, **_archive(node)).returncode == 0
    return []


def _archive(node: SimNode) -> dict[str, str]:
    return {"MPSWRAP_LOG_ARCHIVE": str(node.root / "archive")}


def _farm_done(node: SimNode) -> list[str]:
    (tasks,) = _file("true\n")(node)
    res = node.mpswrap("farm", "--dir", f"{tasks}.farm", tasks)
    assert res.returncode == 0, res
    return [f"{tasks}.farm"]


def _hooks_dir(node: SimNode) -> list[str]:
    return ["--dest", str(node.root / "hooks"), "--config", str(node.root / "none.conf")]


def _not_a_program(node: SimNode) -> list[str]:
    (node.root / "plain.txt").write_text("not a program\n")
    return [str(node.root / "plain.txt")]


#: command -> code -> (setup, argv before the setup's words, argv after them, environment).
CASES: dict[str, dict[str, tuple[Setup, tuple[str, ...], tuple[str, ...], dict[str, str]]]] = {
    "run": {
        "0": (_none, ("run", "-n", "2", "--", "true"), (), {}),
        "1": (_none, ("run", "-n", "1", "--", "true"), (), NO_CONTROL),
        "2": (_none, ("run", "-n", "100", "--", "true"), (), {}),  # over the GPUs' limit
        "69": (
            _none,
            ("run", "-n", "1", "--verify-attach", "fail", "--verify-timeout", "0.5", "--"),
            ("sleep", "20"),
            {},
        ),
        "126": (_not_a_program, ("run", "-n", "1", "--"), (), {}),
        "127": (_none, ("run", "-n", "1", "--", "no-such-program-x"), (), {}),
        # Ranks ignore TERM (mpswrap ends them through MPS first), so the program kills itself.
        "128+N": (_none, ("run", "-n", "1", "--", "sh", "-c", "kill -KILL $$"), (), {}),
    },
    "farm": {
        "0": (_file("true\ntrue\n"), ("farm",), (), {}),
        "1": (_file("true\nfalse\n"), ("farm",), (), {}),
        "2": (_none, ("farm", "/nonexistent/tasks.txt"), (), {}),
        "128+N": (_file("kill -TERM $PPID; sleep 5\n"), ("farm", "--grace", "1"), (), {}),
    },
    "farm status": {
        "0": (_farm_done, ("farm", "status"), (), {}),
        "2": (_none, ("farm", "status", "/nonexistent"), (), {}),
    },
    "calibrate": {
        "0": (_none, ("calibrate", "--counts", "1", "--repeats", "1", "--", "true"), (), {}),
        "1": (_none, ("calibrate", "--counts", "1", "--repeats", "1", "--", "false"), (), {}),
        "2": (_none, ("calibrate", "--max", "100", "--", "true"), (), {}),
        "126": (_not_a_program, ("calibrate", "--counts", "1", "--repeats", "1", "--"), (), {}),
        "127": (_none, ("calibrate", "--", "no-such-program-x"), (), {}),
    },
    "start": {
        "0": (_none, ("start", "--gpus", "0", *JOB), (), {}),
        "1": (_none, ("start", "--gpus", "0", *JOB), (), NO_CONTROL),
        "2": (_none, ("start", "--gpus", "7", *JOB), (), {}),  # no such GPU
    },
    "stop": {
        "0": (_started, ("stop", *JOB), (), {}),
        "1": (_kept_by_a_mount, ("stop", *JOB), (), {}),  # left behind
        "2": (_none, ("stop", "--job", "../x"), (), {}),
    },
    "status": {
        "0": (_started, ("status", *JOB), (), {}),
        "2": (_none, ("status", "--watch", "0"), (), {}),
        "3": (_lost_daemon, ("status", *JOB), (), {}),
        "4": (_none, ("status", *JOB), (), {}),
    },
    "report": {
        "0": (_archived, ("report", "j1"), (), {}),
        "2": (_none, ("report", "j1"), (), {}),  # no log_archive set
        "4": (_none, ("report", "j1"), (), {"MPSWRAP_LOG_ARCHIVE": "/nonexistent"}),
    },
    "metrics": {
        "0": (_none, ("metrics",), (), {}),
        "2": (_file("x", "afile"), ("metrics", "--textfile"), (), {}),
    },
    "config": {
        "0": (_none, ("config",), (), {}),
        "2": (_file("no_such_key = 1\n", "bad.conf"), ("config", "--config"), (), {}),
    },
    "container-args": {
        "0": (_none, ("container-args", "podman"), (), {}),
        "2": (_none, ("container-args", "lxc"), (), {}),
    },
    "demo": {
        "0": (_none, ("demo", "--clients", "2", "--simulate", "yes"), (), {}),
        "1": (_none, ("demo", "--simulate", "no"), (), {"MPSWRAP_GPU_INVENTORY": "nvml"}),
        "2": (_none, ("demo", "--clients", "200", "--simulate", "yes"), (), {}),
    },
    "install-hooks": {
        "0": (_hooks_dir, ("install-hooks", "--python", sys.executable), (), {}),
        "1": (_hooks_dir, ("install-hooks", "--python", "/nonexistent/python"), (), {}),
        "2": (_none, ("install-hooks", "--dest"), (), {}),
    },
    "uninstall-hooks": {
        "0": (_none, ("uninstall-hooks", "--dest", "/nonexistent/hooks"), (), {}),
        "1": (_file("x", "afile"), ("uninstall-hooks", "--dest"), (), {}),
        "2": (_none, ("uninstall-hooks", "--force=yes"), (), {}),
    },
    "sim": {
        "0": (_in_node("gpus.json"), ("sim", "inventory"), ("--gpus", "2"), {}),
        "2": (_none, ("sim", "no-such-command"), (), {}),
    },
    "version": {"0": (_none, ("version",), (), {}), "2": (_none, ("version", "--bogus"), (), {})},
    "completion": {
        "0": (_none, ("completion", "bash"), (), {}),
        "2": (_none, ("completion", "zsh"), (), {}),
    },
    "help": {
        "0": (_none, ("help", "farm", "status"), (), {}),
        "2": (_none, ("help", "stauts"), (), {}),
    },
}


def test_every_command_has_a_case_for_each_exit_code_it_names() -> None:
    documented = {code for code, _ in EXIT_CODES}
    for cmd in COMMANDS:
        assert set(cmd.exits) <= documented, cmd.name
        if cmd.name in HOOKS:
            continue
        assert set(CASES[cmd.name]) == set(cmd.exits), cmd.name
    assert set(CASES) == {c.name for c in COMMANDS} - set(HOOKS)


def test_the_hooks_codes_are_their_contracts() -> None:
    for hook in HOOKS:
        codes = {
            str(code) for case, (name, code) in CONTRACT.items() if name == hook.replace("-", " ")
        }
        assert codes == set(command_named(hook).exits), hook


@pytest.mark.parametrize(
    ("name", "code"), [(name, code) for name, codes in CASES.items() for code in codes]
)
def test_each_code_comes_from_its_case(name: str, code: str, node: SimNode) -> None:
    setup, before, after, env = CASES[name][code]
    if name == "report" and code == "0":
        env = _archive(node)
    words = setup(node)
    try:
        res = node.mpswrap(*before, *words, *after, timeout=120, **env)
    finally:
        _unmount(node)
    got = str(res.returncode)
    if code == "128+N":
        got = "128+N" if res.returncode > 128 else got
    assert got == code, res
    assert "Traceback" not in res.stderr, res.stderr
    if code == "2":  # a usage error is said in one line
        assert res.stderr.startswith(("mpswrap: ", "install.sh: ", "usage: ")), res.stderr
    node.mpswrap("stop", *JOB)
