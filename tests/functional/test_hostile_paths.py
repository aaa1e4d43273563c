"""Hostile paths at the root hooks: what another user (or the job's own user) plants or swaps
in the directories root works in, with two real users.

A symlink swapped in at any level of ``<run_dir>/<node>/<job>/<gpu>/{pipe,log}``, where the
level above is someone else's to change, must never make root read, write or remove anything
outside run_dir (a root-owned sentinel tree beside run_dir mimics the layout, so a hook that
follows a link would find something to act on). The prolog refuses with one line naming the
unsafe level and starts nothing; the epilog refuses the same way, ends the job's daemon where
it can, and exits by epilog_failure. Files the job's user controls (logs, manifest, pid file)
replaced by a FIFO or a symlink never stall or feed the epilog.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.functional.test_faults import admin_config, gone, manifests, slurm_hook
from tests.functional.test_security import tree
from tests.simenv import MPSWRAP, SimNode, finish_sim_node, make_sim_node
from tests.tree import REPO
from tests.users import ensure_other_user, ensure_test_user, run_as

pytestmark = [
    pytest.mark.functional,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: two real users"),
]
JOB = "101"
#: A teardown that refuses, ends the daemon and exits is done in seconds (the simulator's
#: timeouts are 2-3 s); a read that blocks is killed by slurmd after its own timeout.
PROMPT = 30.0
REFUSALS = (
    "refusing a path that is not a plain directory",
    "directory has the wrong owner",
    "directory is open to other users",
)


@dataclass
class Site:
    """A simulated node whose run_dir has one level of its own above it (``site``)."""

    node: SimNode
    job_user: pwd.struct_passwd
    other: pwd.struct_passwd

    @property
    def site(self) -> Path:
        return self.node.root / "site"

    @property
    def run(self) -> Path:
        return self.site / "run"

    @property
    def sentinel(self) -> Path:
        """Root's tree beside run_dir, laid out like it: what a followed link would reach."""
        return self.site / "sentinel"

    def level(self, name: str) -> Path:
        return {
            "site": self.site,
            "run": self.run,
            "node": self.run / "n1",
            "job": self.run / "n1" / JOB,
        }[name]

    def hook(self, hook: str, **env: str) -> subprocess.CompletedProcess[str]:
        return slurm_hook(self.node, hook, user=self.job_user.pw_name, gpus="0", timeout=90, **env)


@pytest.fixture
def site() -> Iterator[Site]:
    node = make_sim_node(gpus=1)
    found = Site(node, pwd.getpwnam(ensure_test_user()), pwd.getpwnam(ensure_other_user()))
    found.site.mkdir(mode=0o755)
    found.site.chmod(0o755)
    admin_config(node, run_dir=str(found.run))
    _plant_sentinel(found.sentinel)
    yield found
    left = finish_sim_node(node)
    assert not left, f"left behind: {left}"


def _plant_sentinel(root: Path) -> None:
    """g0 (the job's GPU) and g1: a hook following a link acts on one or the other."""
    files = {root / "precious": "root's data\n"}
    for key in ("g0", "g1"):
        gpu = root / "n1" / JOB / key
        for sub in ("pipe", "log"):
            (gpu / sub).mkdir(parents=True, mode=0o755)
        files.update(
            {
                root / "n1" / JOB / f".{key}.lock": "",
                gpu / "manifest.json": "{}\n",
                gpu / "pipe" / "nvidia-cuda-mps-control.pid": "1\n",
                gpu / "log" / "control.log": "root's log\n",
                gpu / "log" / "server.log": "root's log\n",
            }
        )
    for path, text in files.items():
        path.write_text(text)
        path.chmod(0o600)


def _make_unsafe(site: Site, level: str, how: str) -> None:
    """Root (the admin) leaves ``level`` to the other user: theirs, or writable by all."""
    path = site.level(level)
    if how == "owned":
        os.chown(path, site.other.pw_uid, site.other.pw_gid)
    else:
        path.chmod(0o777)


def _swap(site: Site, user: str, path: Path, target: Path) -> None:
    """``user`` moves ``path`` aside and puts a link to ``target`` in its place."""
    res = run_as(user, ["sh", "-c", f"mv {path} {path}.old && ln -s {target} {path}"])
    assert res.returncode == 0, res.stderr
    assert path.is_symlink()


def _refused(stderr: str, path: Path) -> list[str]:
    """The lines that refuse ``path`` by name, each one whole line of its own."""
    assert "Traceback" not in stderr, stderr
    return [
        ln for ln in stderr.splitlines() if f"({path})" in ln and any(r in ln for r in REFUSALS)
    ]


def _daemons(site: Site) -> list[int]:
    pids = [int(m["daemon_pid"]) for m in manifests(site.level("job")).values()]
    assert pids and not any(gone(pid) for pid in pids)
    return pids


# --- the prolog: an unsafe level before anything is made --------------------------------------
@pytest.mark.parametrize("how", ["owned", "open"])
@pytest.mark.parametrize("level", ["site", "run", "node"])
def test_the_prolog_refuses_a_level_another_user_controls_and_starts_nothing(
    site: Site, level: str, how: str
) -> None:
    """``site``: an ancestor of run_dir; ``run``: run_dir; ``node``: the node directory. The
    other user plants a link to the sentinel one level below; the prolog must name the
    level it cannot trust, not the link (and never go on below it)."""
    below = {"site": "run", "run": "node", "node": "job"}[level]
    for name in ("run", "node")[: ("site", "run", "node").index(level)]:
        site.level(name).mkdir(mode=0o755)
    _make_unsafe(site, level, how)
    target = site.sentinel / site.level(below).relative_to(site.run)
    _swap_in(site, site.level(below), target)
    before = tree(site.sentinel)
    res = site.hook("prolog")
    assert res.returncode == 0, res.stderr  # prolog_failure = continue
    assert len(_refused(res.stderr, site.level(level))) == 1, res.stderr
    assert tree(site.sentinel) == before
    assert not site.node.leftovers(), "the prolog started something"


def _swap_in(site: Site, path: Path, target: Path) -> None:
    """The other user puts a link where the prolog will look (nothing is there yet)."""
    res = run_as(site.other.pw_name, ["ln", "-s", str(target), str(path)])
    assert res.returncode == 0, res.stderr


# --- the epilog: a level swapped while the job ran ------------------------------------------
@pytest.mark.parametrize("how", ["owned", "open"])
@pytest.mark.parametrize("level", ["site", "run", "node"])
def test_the_epilog_refuses_a_swapped_shared_level_and_still_ends_the_daemon(
    site: Site, level: str, how: str
) -> None:
    """After the prolog, a level above the job directory is left to the other user, who swaps
    the level below it for a link into the sentinel. The epilog must not enter: it names the
    level and ends the daemon it cannot reach through the tree, found by its environment.
    Nothing of the job runs any more, so it exits 0: the tree it could not remove is named,
    never a reason to drain (the other user would otherwise drain the node at will)."""
    start = site.hook("prolog")
    assert start.returncode == 0, start.stderr
    pids = _daemons(site)
    below = {"site": "run", "run": "node", "node": "job"}[level]
    _make_unsafe(site, level, how)
    target = site.sentinel / site.level(below).relative_to(site.run)
    _swap(site, site.other.pw_name, site.level(below), target)
    before = tree(site.sentinel)
    took = time.monotonic()
    res = site.hook("epilog")
    assert time.monotonic() - took < PROMPT
    assert tree(site.sentinel) == before, "the epilog acted through the other user's link"
    assert _refused(res.stderr, site.level(level)), res.stderr
    assert res.returncode == 0, res.stderr
    assert all(gone(pid) for pid in pids), f"daemon left running: {res.stderr}"


@pytest.mark.parametrize(
    ("level", "attacker"),
    [("job", "other"), ("gpu", "job_user"), ("pipe", "job_user"), ("log", "job_user")],
)
def test_the_epilog_never_follows_a_link_in_the_job_tree_and_ends_the_daemon(
    site: Site, level: str, attacker: str
) -> None:
    """Below the node directory the job's user owns every level: it swaps its GPU, pipe or log
    directory for a link into the sentinel, or opens its job directory to the other user, who
    swaps the GPU directory. The epilog names the link, follows nothing, ends the daemon by
    signal (commands would go through the link) and removes the job's tree: exit 0."""
    start = site.hook("prolog")
    assert start.returncode == 0, start.stderr
    pids = _daemons(site)
    job = site.level("job")
    path = {
        "job": job / "g0",
        "gpu": job / "g0",
        "pipe": job / "g0" / "pipe",
        "log": job / "g0" / "log",
    }[level]
    if level == "job":
        assert run_as(site.job_user.pw_name, ["chmod", "777", str(job)]).returncode == 0
    user = site.other if attacker == "other" else site.job_user
    _swap(site, user.pw_name, path, site.sentinel / path.relative_to(site.run))
    before = tree(site.sentinel)
    took = time.monotonic()
    res = site.hook("epilog")
    assert time.monotonic() - took < PROMPT
    assert tree(site.sentinel) == before, "the epilog acted through the job user's link"
    assert _refused(res.stderr, path), res.stderr
    assert all(gone(pid) for pid in pids), f"daemon left running: {res.stderr}"
    assert (res.returncode, job.exists()) == (0, False), res.stderr


# --- files the job's user controls ------------------------------------------------------------
PLANTED = {
    "control.log": "g0/log/control.log",
    "server.log": "g0/log/server.log",
    "manifest.json": "g0/manifest.json",
    "pid file": "g0/pipe/nvidia-cuda-mps-control.pid",
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "root-file"])
@pytest.mark.parametrize("name", list(PLANTED))
def test_a_planted_fifo_or_link_never_stalls_or_feeds_the_epilog(
    site: Site, name: str, kind: str
) -> None:
    """The job's user replaces a file of its job's directories by a FIFO (an open for reading
    would block), a link to /dev/zero (a read would never end) or a link to a file of root's
    (for the pid file, with the manifest gone). Root takes who the daemon is from its own
    record, so it reads neither the manifest, the pid file nor control.log; server.log, which
    it counts terminations in, it reads only as a regular file (a warning names the planted
    one). Either way it ends the daemon and removes the tree, promptly: exit 0."""
    secret = site.node.root / "secret"
    secret.write_text("1\n")
    secret.chmod(0o600)
    start = site.hook("prolog")
    assert start.returncode == 0, start.stderr
    pids = _daemons(site)
    path = site.level("job") / PLANTED[name]
    plant = {
        "fifo": f"mkfifo {path}",
        "dev-zero": f"ln -s /dev/zero {path}",
        "root-file": f"ln -s {secret} {path}",
    }[kind]
    gone_too = site.level("job") / PLANTED["manifest.json"] if name == "pid file" else path
    res = run_as(site.job_user.pw_name, ["sh", "-c", f"rm -f {path} {gone_too} && {plant}"])
    assert res.returncode == 0, res.stderr
    took = time.monotonic()
    try:
        res = site.hook("epilog")
    except subprocess.TimeoutExpired:
        pytest.fail(f"the epilog hung on the planted {kind} at {path}")
    assert time.monotonic() - took < PROMPT, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    read_by_root = name == "server.log"
    assert (f"not reading {path}" in res.stderr) == read_by_root, res.stderr
    assert all(gone(pid) for pid in pids), f"daemon left running: {res.stderr}"
    assert (res.returncode, site.level("job").exists()) == (0, False), res.stderr
    assert secret.read_text() == "1\n"


def test_roots_status_reads_the_run_record_without_following_or_stalling(site: Site) -> None:
    """The run record (``job.outcomes``) is the job user's. Root's ``mpswrap status`` counts
    only the records the user could have written themselves: a FIFO named like a record does
    not block it, a link to /dev/zero or to a file of root's is not followed, and none of
    them changes its exit code. The epilog then removes it all: exit 0."""
    secret = site.node.root / "secret"
    secret.write_text('[{"code": 99, "attached": null}]\n')
    secret.chmod(0o600)
    assert site.hook("prolog").returncode == 0
    folder = site.level("job") / "outcomes"
    plant = (
        f"mkdir -m 700 {folder} && cd {folder}"
        ' && echo \'[{"code": 5, "attached": null}]\' > 1-0000000a.json'
        f" && mkfifo 2-0000000b.json && ln -s /dev/zero 3-0000000c.json"
        f" && ln -s {secret} 4-0000000d.json"
    )
    res = run_as(site.job_user.pw_name, ["sh", "-c", plant])
    assert res.returncode == 0, res.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPSWRAP_", "SLURM"))}
    env.update(MPSWRAP_CONFIG=str(site.node.root / "mpswrap.conf"), PYTHONPATH=str(REPO))
    argv = [*MPSWRAP, "status", "--json", "--job", JOB, "--node", "n1"]
    try:
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=PROMPT)
    except subprocess.TimeoutExpired:
        pytest.fail("root's status hung on the planted run record")
    assert res.returncode == 0, res.stderr
    (job,) = json.loads(res.stdout)["jobs"]
    assert job["runs"] == {"ended": 1, "exit_codes": {"5": 1}}, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    end = site.hook("epilog")
    assert (end.returncode, site.level("job").exists()) == (0, False), end.stderr
    assert secret.read_text() == '[{"code": 99, "attached": null}]\n'
