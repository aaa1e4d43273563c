"""cgroup v2: the one owner of the kernel's cgroup file system.

Root starts each job's daemons in cgroups of its own, ``<parent>/<node>.<job>/<gpu key>``
(``parent``: the ``cgroup_root`` setting, by default ``<cgroup2 mount>/mpswrap``). The kernel,
not a file of the job user's, then says which processes are the daemon's: its servers are its
children and start in its cgroup, and nothing the job user does moves a process out of it or
hides one there, since a move needs write access to ``cgroup.procs`` of the common ancestor,
which is root's. Teardown ends a cgroup with ``cgroup.kill`` (Linux >= 5.14; before that each
PID of ``cgroup.procs`` is killed through a pidfd until none is left), waits for
``populated 0`` in ``cgroup.events`` and removes it. Models: Slurm's proctrack/cgroup with its
cgroup/v2 plugin (``cgroup.kill`` of a step's user cgroup), systemd's scopes.

mpswrap never enables a controller in its cgroups, so a cgroup of its is a leaf that may hold
processes wherever it lies (the kernel's no-internal-process rule binds only a cgroup that
distributes a controller to its children).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import stat
from pathlib import Path

from ._struct import Struct
from ._wait import backoff

__all__ = ["Cgroup", "member_of", "mount_point", "parent_dir", "paths_of"]

log = logging.getLogger(__name__)

MOUNTINFO = "/proc/self/mountinfo"
#: The folder mpswrap makes below the cgroup2 mount when ``cgroup_root`` is ``auto``.
AUTO_NAME = "mpswrap"
#: PIDs read from ``cgroup.procs`` at most: a daemon and its servers are a handful.
PROCS_LIMIT = 4096


def mount_point(mountinfo: str = MOUNTINFO) -> Path | None:
    """Where cgroup2 is mounted (``/sys/fs/cgroup``; ``/sys/fs/cgroup/unified`` on a hybrid
    system), None where it is not."""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields = line.split()
                # ID PARENT MAJ:MIN ROOT MOUNT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
                if "-" in fields and fields[fields.index("-") + 1 : fields.index("-") + 2] == [
                    "cgroup2"
                ]:
                    return Path(fields[4].replace("\\040", " "))
    except OSError:
        return None
    return None


def parent_dir(setting: str) -> Path | None:
    """The folder job cgroups go in: the ``cgroup_root`` setting's path, ``auto``'s folder
    below the cgroup2 mount, or None (``none``, or no cgroup2 mounted)."""
    if setting == "none":
        return None
    if setting != "auto":
        return Path(setting)
    mount = mount_point()
    return mount / AUTO_NAME if mount else None


def paths_of(pid: int) -> list[str]:
    """Every cgroup path of ``pid``, one for each hierarchy ``/proc/PID/cgroup`` lists (the
    cgroup2 one and any v1 ones); none when gone or unreadable."""
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as handle:
            lines = handle.read(64 << 10).splitlines()
    except OSError:
        return []
    fields = (line.split(b":", 2) for line in lines)
    return [f[2].decode(errors="replace") for f in fields if len(f) == 3]


def member_of(pid: int) -> str | None:
    """The cgroup2 path of ``pid`` (``/mpswrap/n1.42/g0``, relative to the mount), None when
    gone or unreadable."""
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as handle:
            for line in handle.read(64 << 10).splitlines():
                if line.startswith(b"0::"):
                    return line[3:].decode(errors="replace")
    except OSError:
        return None
    return None


class Cgroup(Struct, frozen=True):
    """One cgroup of root's, by its path in the cgroup file system."""

    path: Path

    @property
    def relative(self) -> str:
        """The path as ``/proc/PID/cgroup`` names it (relative to the cgroup2 mount)."""
        mount = mount_point()
        if mount is None:
            return str(self.path)
        return "/" + str(self.path.relative_to(mount)) if self.path != mount else "/"

    def holds(self, where: str | None) -> bool:
        """Whether the cgroup path ``where`` (``member_of``) is this one or below it."""
        mine = self.relative.rstrip("/")
        return where is not None and (where == self.relative or where.startswith(mine + "/"))

    def make(self) -> Cgroup:
        """Create it and any missing level above it below the mount, root's (mode 0755); an
        existing level must be a directory of root's that no one else may write."""
        mount = mount_point()
        levels = [self.path] if mount is None else _below(mount, self.path)
        for level in levels:
            try:
                os.mkdir(level, 0o755)
            except FileExistsError:
                pass
            _check_owned(level)
        return self

    def exists(self) -> bool:
        return os.path.isdir(self.path)

    def procs(self) -> list[int]:
        """The PIDs in it and in every cgroup below it (none when it is gone)."""
        found: list[int] = []
        for root, dirs, _ in os.walk(self.path):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
            found += _read_pids(Path(root) / "cgroup.procs")
            if len(found) >= PROCS_LIMIT:
                break
        return found[:PROCS_LIMIT]

    def populated(self) -> bool:
        """Whether a process is in it or below it (``cgroup.events``); False when gone."""
        try:
            text = (self.path / "cgroup.events").read_text()
        except FileNotFoundError:
            return False
        except OSError:
            return bool(self.procs())
        return "populated 1" in text

    def kill(self) -> None:
        """SIGKILL everything in it and below it: ``cgroup.kill`` where the kernel has it
        (what forks meanwhile is killed too), else each PID through a pidfd, frozen first
        where the freezer is there, until the cgroup is empty or no PID is left to kill."""
        try:
            (self.path / "cgroup.kill").write_text("1")
            return
        except FileNotFoundError:
            if not self.exists():
                return
        except OSError as exc:
            log.debug("cgroup.kill of %s: %s", self.path, exc)
        self._freeze(True)
        try:
            for _ in range(100):  # a process that forks as it dies: bounded rounds
                pids = self.procs()
                if not pids:
                    return
                for pid in pids:
                    self._kill_member(pid)
        finally:
            self._freeze(False)

    def _freeze(self, frozen: bool) -> None:
        try:
            (self.path / "cgroup.freeze").write_text("1" if frozen else "0")
        except OSError:
            pass

    def _kill_member(self, pid: int) -> None:
        """SIGKILL ``pid`` if it is still in this cgroup, through a pidfd: a PID that a new
        process took meanwhile is not signalled."""
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            return
        try:
            if self.holds(member_of(pid)):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)

    def wait_empty(self, timeout: float) -> bool:
        """Wait until nothing is in it (bounded); whether it is empty."""
        for _ in backoff(timeout, first=0.002, cap=0.02):
            if not self.populated():
                return True
        return not self.populated()

    def remove(self) -> bool:
        """Remove it and the empty cgroups below it; whether it is gone."""
        if not self.exists():
            return True
        for root, dirs, _ in os.walk(self.path, topdown=False):
            for name in dirs:
                _rmdir(Path(root) / name)
        _rmdir(self.path)
        return not self.exists()


def _below(mount: Path, path: Path) -> list[Path]:
    """The levels of ``path`` below ``mount``, outermost first."""
    rel = path.relative_to(mount)
    return [mount.joinpath(*rel.parts[: i + 1]) for i in range(len(rel.parts))]


def _check_owned(level: Path) -> None:
    st = os.lstat(level)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise PermissionError(
            errno.EPERM, "not a directory of root's that only root may write", str(level)
        )


def _read_pids(path: Path) -> list[int]:
    try:
        with open(path, "rb") as handle:
            data = handle.read(PROCS_LIMIT * 8)
    except OSError:
        return []
    return [int(tok) for tok in data.split() if tok.isdigit() and len(tok) <= 10]


def _rmdir(path: Path) -> None:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.debug("cannot remove cgroup %s: %s", path, exc)
