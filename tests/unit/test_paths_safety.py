"""Path safety at function level: StrictModes for the levels above a job, removal that never
leaves the tree, reads of files a job's user controls, and the races of prologs and epilogs
of one node (made deterministic by hooking the calls between which they happen)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from mpswrap import _lock, _proc, _wait
from mpswrap.config import load_settings
from mpswrap.errors import LayoutError, LockTimeout
from mpswrap.job import state
from mpswrap.job.job import JobDaemons, Teardown, job_dir_held
from mpswrap.job.owners import OWNER_LOCK, dir_identity
from mpswrap.paths import JobLayout, check_dirs
from mpswrap.removal import remove_tree
from tests.tree import REPO

ME = frozenset({0, os.geteuid()})


# --- StrictModes ------------------------------------------------------------------------------
def test_check_dirs_names_the_first_level_others_may_change(tmp_path: Path) -> None:
    base = tmp_path / "base"
    (base / "open" / "run").mkdir(parents=True)
    check_dirs(base / "open" / "run" / "not-yet" / "deeper", ME)  # missing levels: fine
    (base / "open").chmod(0o777)
    with pytest.raises(LayoutError) as err:
        check_dirs(base / "open" / "run", ME)
    assert err.value.line() == (
        f"directory is open to other users ({base / 'open'}): mode 0777: group or others may "
        "write to it"
    )
    (base / "open").chmod(0o1777)  # sticky, like /tmp: nobody renames what is not theirs
    check_dirs(base / "open" / "run", ME)
    (base / "link").symlink_to(base / "open")
    with pytest.raises(LayoutError, match=rf"not a plain directory \({base / 'link'}\)$"):
        check_dirs(base / "link" / "run", ME)


def test_check_dirs_refuses_a_level_of_an_untrusted_owner(tmp_path: Path) -> None:
    others = frozenset({4242})  # whoever runs the test is not trusted here
    with pytest.raises(LayoutError, match=r"directory has the wrong owner \(/\): owned by uid 0"):
        check_dirs(tmp_path, others)


# --- removal ---------------------------------------------------------------------------------
def _listing(root: Path) -> dict[str, bytes]:
    return {
        str(p): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
        for p in [root, *sorted(root.rglob("*"))]
    }


def test_remove_tree_never_leaves_the_tree_through_a_symlink_at_any_level(tmp_path: Path) -> None:
    """A level above the tree swapped for a link (run_dir, by whoever may write its parent):
    removing ``<link>/n1/101`` must not remove the target's ``n1/101``. Inside the tree, links
    and FIFOs are removed themselves, never what a link points at."""
    sentinel = tmp_path / "sentinel"
    (sentinel / "n1" / "101" / "g0").mkdir(parents=True)
    (sentinel / "n1" / "101" / "g0" / "keep").write_text("root's\n")
    before = _listing(sentinel)
    (tmp_path / "run").symlink_to(sentinel)
    problem = remove_tree(tmp_path / "run" / "n1" / "101")
    assert _listing(sentinel) == before
    assert problem == (
        f"directory {tmp_path / 'run' / 'n1' / '101'} (refusing a path that is not a plain "
        f"directory ({tmp_path / 'run'}))"
    )
    job = tmp_path / "job"
    (job / "g0" / "pipe").mkdir(parents=True)
    (job / "g0" / "log").symlink_to(sentinel / "n1" / "101" / "g0")
    (job / "g0" / "manifest.json").symlink_to(sentinel / "n1" / "101" / "g0" / "keep")
    os.mkfifo(job / "g0" / "pipe" / "fifo")
    (job / "g0" / "pipe" / "file").write_text("x")
    assert remove_tree(job) is None
    assert not os.path.lexists(job)
    assert _listing(sentinel) == before


def test_remove_tree_looks_at_its_deadline_between_entries_at_any_depth(tmp_path: Path) -> None:
    """A deadline that passes while one directory of thousands of names (deep down) is
    emptied stops the removal there: the tree is named as not emptied in time, and what is
    left goes with the next removal."""
    many = tmp_path / "job" / "g0" / "log" / "a" / "b"
    many.mkdir(parents=True)
    for k in range(5000):
        (many / f"f{k}").touch()
    problem = remove_tree(tmp_path / "job", _wait.Deadline(0))
    assert problem == (
        f"directory {tmp_path / 'job'} ({tmp_path / 'job'}: not emptied within the teardown's "
        "deadline)"
    )
    assert 0 < len(os.listdir(many)) < 5000
    assert remove_tree(tmp_path / "job") is None
    assert not os.path.lexists(tmp_path / "job")


# --- reads of files a job's user controls --------------------------------------------------------
READERS = {
    "manifest": ("from mpswrap.mps.manifest import read_manifest as read", "manifest.json", "None"),
    "pid file": ("from mpswrap.mps.control import read_pid as read", "control.pid", "None"),
    "control.log": ("from mpswrap.mps.mpslog import server_pids as read", "control.log", "set()"),
    "server.log": ("from mpswrap.mps.mpslog import read_faults as read", "server.log", "[]"),
}


def _read_in_a_child(reader: str, path: Path) -> subprocess.CompletedProcess[str]:
    """The reader in a process of its own, its memory capped: a read that blocks (a FIFO) or
    never ends (/dev/zero) shows as a timeout or a MemoryError, not as a stuck test run."""
    code = (
        "import resource, sys; from pathlib import Path\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        f"{reader}\nprint(repr(read(Path(sys.argv[1]))))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        return subprocess.run(
            [sys.executable, "-c", code, str(path)],
            env=env,
            text=True,
            capture_output=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading {path} blocked")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "link-to-a-file", "hard-link"])
@pytest.mark.parametrize("reader", list(READERS))
def test_a_planted_file_reads_as_absent_with_a_warning(
    tmp_path: Path, reader: str, kind: str
) -> None:
    statement, name, absent = READERS[reader]
    other = tmp_path / "someone-elses"
    other.write_text("4242\n")
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "link-to-a-file":
        path.symlink_to(other)
    else:
        os.link(other, path)
    res = _read_in_a_child(statement, path)
    assert (res.returncode, res.stdout.strip()) == (0, absent), res.stderr
    assert f"not reading {path}" in res.stderr, res.stderr


def test_a_log_larger_than_the_cap_is_read_from_its_end(tmp_path: Path) -> None:
    from mpswrap.mps import mpslog

    log = tmp_path / "control.log"
    line = "[2026-11-22 06:53:48.123 Control 4242] Starting new server {} for user 1000\n"
    filler = "[2026-11-22 06:53:48.123 Control 4242] " + "x" * 200 + "\n"
    with log.open("w") as out:
        out.write(line.format(1))
        out.write(filler * (mpslog.LOG_LIMIT // len(filler) + 10))
        out.write(line.format(2))
    assert mpslog.server_pids(log) == {2}


# --- races of prologs and epilogs on one node --------------------------------------------------
def test_a_prolog_keeps_its_job_dir_when_another_jobs_epilog_removes_the_node_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without PrologFlags=Alloc, job 2's prolog runs beside job 1's epilog. The epilog
    removes the node directory once it is empty; here it does so right between the prolog's
    making the node directory and its job directory in it."""
    run = tmp_path / "run"
    settings = load_settings({"run_dir": str(run)}, env={})
    ending, starting = JobLayout(run, "n1", "j1"), JobLayout(run, "n1", "j2")
    state.create(ending, os.getuid(), os.getgid(), shared_parents=True)
    real_mkdir, epilogs = os.mkdir, list[Teardown]()

    def mkdir(path: str | Path, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        if os.fspath(path).endswith("j2") and not epilogs:  # the node directory is made
            epilogs.append(JobDaemons(ending, settings).stop())
            assert not (run / "n1").exists(), "the epilog should have removed it"
        real_mkdir(path, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", mkdir)
    made = state.create(starting, os.getuid(), os.getgid(), shared_parents=True)
    assert epilogs and epilogs[0].clean
    assert made == starting.job_dir and made.is_dir() and not ending.job_dir.exists()


def test_a_rank_joins_when_the_jobs_last_owner_removes_the_directory_before_its_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-rank user mode (``srun mpswrap`` without the prolog): a rank that ended at once was
    the job's last owner and tore its directory down right between another rank's making it
    and taking its owner lock (seen in CI: "cannot take lock (…/.owner.lock): No such file or
    directory", exit 1). The joining rank makes it again and holds the lock of the new one."""
    layout = JobLayout(tmp_path / "run", "n1", "j1")
    settings = load_settings({"run_dir": str(tmp_path / "run")}, env={})
    user = _proc.lookup_user()
    real_acquire, torn = _lock.DirLock.acquire, list[Teardown]()

    def acquire(self: _lock.DirLock) -> None:
        if not torn:  # the other rank leaves, last, now
            torn.append(JobDaemons(layout, settings).stop())
            assert not layout.job_dir.exists(), "the last owner's teardown should remove it"
        real_acquire(self)

    monkeypatch.setattr(_lock.DirLock, "acquire", acquire)
    with job_dir_held(layout, user, settings) as dir_id:
        assert layout.job_dir.is_dir() and dir_identity(layout.job_dir) == dir_id
        held = _lock.file_lock(layout.job_dir / OWNER_LOCK, timeout=0.1)
        with pytest.raises(LockTimeout):
            held.acquire()  # the lock of the directory that is there now is held
    assert torn and torn[0].clean


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a directory for another uid")
def test_two_prologs_of_one_job_both_get_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first makes the job directory, root's until its chown to the job's user; the
    second finds it right then. It must wait for that chown, not refuse a directory that is
    about to be right."""
    layout, uid, gid = JobLayout(tmp_path / "run", "n1", "j1"), 4242, 4242
    made, second_looked = threading.Event(), threading.Event()
    second: list[threading.Thread] = []
    real_fchown, real_fstat, real_lstat = os.fchown, os.fstat, os.lstat

    def fchown(fd: int, owner: int, group: int) -> None:
        made.set()  # made, not yet the job user's: the second prolog looks now
        second_looked.wait(timeout=5)
        real_fchown(fd, owner, group)

    def looked(real: Callable[..., os.stat_result]) -> Callable[..., os.stat_result]:
        """``real`` (lstat or fstat), noting when the second prolog has looked at the job
        directory (by path, or through a descriptor)."""

        def stat(what: int | str | Path, *args: object, **kwargs: object) -> os.stat_result:
            found = real(what, *args, **kwargs)
            name = os.readlink(f"/proc/self/fd/{what}") if isinstance(what, int) else what
            if threading.current_thread() in second and str(name) == str(layout.job_dir):
                second_looked.set()
            return found

        return stat

    monkeypatch.setattr(os, "fchown", fchown)
    monkeypatch.setattr(os, "fstat", looked(real_fstat))
    monkeypatch.setattr(os, "lstat", looked(real_lstat))
    results: dict[str, object] = {}

    def prolog(name: str) -> None:
        try:
            results[name] = state.create(layout, uid, gid, shared_parents=True)
        except LayoutError as exc:
            results[name] = exc

    first = threading.Thread(target=prolog, args=("first",))
    first.start()
    assert made.wait(timeout=10)
    second.append(threading.Thread(target=prolog, args=("second",)))
    second[0].start()
    for thread in (first, second[0]):
        thread.join(timeout=30)
    assert results == {"first": layout.job_dir, "second": layout.job_dir}
    st = real_lstat(layout.job_dir)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (uid, gid, 0o700)
