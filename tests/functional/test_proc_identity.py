"""_proc's identity of a process, read from /proc without psutil: the same start time psutil
reports (ProcIds written by one are compared by the other), and a zombie, a gone or a reused PID
is not alive."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from mpswrap import _proc
from tests.tree import REPO
from tests.waits import wait_until

pytestmark = pytest.mark.functional


def test_start_times_are_psutils() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for pid in (1, os.getpid(), os.getppid(), child.pid):
            ident = _proc.identify(pid)
            assert ident is not None and ident.start_time == psutil.Process(pid).create_time()
            assert _proc.is_alive(ident)
        assert _proc.is_alive(_proc.ProcId(child.pid, psutil.Process(child.pid).create_time()))
    finally:
        child.kill()
        child.wait()


def test_zombie_gone_and_reused_pids_are_not_alive() -> None:
    child = subprocess.Popen(["true"])
    ident = _proc.identify(child.pid)
    assert ident is not None
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert _proc.identify(child.pid) == ident, "a zombie keeps its identity"
    assert not _proc.is_alive(ident)
    child.wait()
    assert _proc.identify(child.pid) is None and not _proc.is_alive(ident)
    me = _proc.identify(os.getpid())
    assert me is not None and not _proc.is_alive(_proc.ProcId(me.pid, me.start_time - 1))


#: A process that asks which processes have the variable, and says its own PID.
ASKS = (
    "import json, os; from mpswrap import _proc; "
    "print(json.dumps([os.getpid(), [p.pid for p, _ in _proc.procs_with_env('MPSWRAP_T_PIPE')]]))"
)


def test_processes_with_a_variable_are_found_by_one_read_of_their_environment() -> None:
    """``procs_with_env``: this user's processes that set the variable, with the values asked
    for, among given PIDs or all; zombies and the caller left out."""
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    env = {**os.environ, "MPSWRAP_T_PIPE": "/p/one", "MPSWRAP_T_MORE": "x"}
    named = subprocess.Popen(sleep, env=env)
    other = subprocess.Popen(sleep, env={**os.environ, "MPSWRAP_T_PIPE_NOT": "/p/two"})
    zombie = subprocess.Popen(["true"], env=env)
    try:
        wait_until(
            lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, 30, "a zombie"
        )
        found = {p.pid: v for p, v in _proc.procs_with_env("MPSWRAP_T_PIPE", "MPSWRAP_T_MORE")}
        assert found[named.pid] == {"MPSWRAP_T_PIPE": "/p/one", "MPSWRAP_T_MORE": "x"}
        assert other.pid not in found and zombie.pid not in found and os.getpid() not in found
        asks = subprocess.run(  # a process that has the variable itself, as a rank's does
            [sys.executable, "-c", ASKS],
            env={**env, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            check=True,
        )
        own, seen = json.loads(asks.stdout)
        assert named.pid in seen and own not in seen  # the caller is skipped
        among = _proc.procs_with_env("MPSWRAP_T_PIPE", among=[other.pid, zombie.pid, named.pid])
        assert among == [(_proc.identify(named.pid), {"MPSWRAP_T_PIPE": "/p/one"})]
    finally:
        for proc in (named, other, zombie):
            proc.kill()
            proc.wait()


#: A process with a child, and that child's child, all sleeping until killed.
_SLEEP = "import time; time.sleep(60)"
_START = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {!r}]); "
_FAMILY = _START.format(_START.format(_SLEEP) + _SLEEP) + _SLEEP


def test_descendants_from_one_reading_are_what_children_of_finds() -> None:
    """Two ranks, each a parent with a child and a grandchild: one reading of the process
    table finds each one's, as reading it for each does, and nothing for a PID that is gone."""
    parents = [subprocess.Popen([sys.executable, "-c", _FAMILY]) for _ in range(2)]
    try:
        pids = [p.pid for p in parents]
        wait_until(lambda: all(len(_proc.children_of(p)) == 2 for p in pids), 30, "descendants")
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait(timeout=30)
        table = _proc.descendants([p.pid for p in parents] + [dead.pid])
        for parent in parents:
            assert set(table[parent.pid]) == set(_proc.children_of(parent.pid))
            assert len(table[parent.pid]) == 2
        assert table[dead.pid] == []
    finally:
        for parent in parents:
            _proc.kill_procs(_proc.children_of(parent.pid))
            parent.kill()
            parent.wait(timeout=30)
