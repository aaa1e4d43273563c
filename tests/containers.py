"""Containers for the functional tests: rootless Podman (Debian 12's podman 4.3 and crun) and
bubblewrap, run as the test user on this machine, with no image registry.

What the CI machine needs, and why (all of it here, nowhere else):

- The machine is itself a container whose cgroups are in hybrid mode, which crun refuses;
  so the test's command runs in a mount namespace of its own (root's ``unshare -m``) where
  ``/sys/fs/cgroup/unified`` is unmounted, then as the test user. Podman runs with
  ``--cgroup-manager=cgroupfs --cgroups=disabled``, and ``CONTAINERS_CONF`` sets the
  ulimits crun can set here. None of this is what a user types; where cgroups are in one
  mode (the GPU machine, a cluster node) the ``umount`` fails harmlessly.
- No registry: the container's root is a directory of the test user's (``--rootfs``) that
  holds only empty mount points and the links of a merged /usr; the host's /usr, /etc, /opt,
  the tree under test and the simulator's programs are bound into it read-only. The job's
  directories are *not*: the container sees its daemon only through the bind that
  ``mpswrap container-args podman`` gives.
- Rootless Podman keeps a pause process per user (``catatonit``, its user namespace) after
  the container is gone: ``PodmanUser.close`` ends it by the PID Podman recorded, once it is
  seen to be that user's catatonit. It is Podman's, not a rank's.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.simenv import MPSWRAP, SimNode
from tests.tree import REPO
from tests.users import TEST_USER, ensure_test_user, user_argv

#: The programs these tests run; tools/test.sh installs them (podman crun uidmap bubblewrap).
TOOLS = ("podman", "crun", "conmon", "newuidmap", "bwrap", "unshare")
#: Root's step before the test user's command: crun refuses cgroups in hybrid mode.
_NAMESPACE = ["unshare", "-m", "--propagation", "private", "sh", "-c"]
_UNMOUNT = 'umount /sys/fs/cgroup/unified 2>/dev/null; mount --make-rshared /; exec "$@"'
#: The ulimits crun sets in the container (it cannot raise nofile past this machine's).
_CONF = '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
#: The host's directories a container's root gets, read-only.
_HOST_DIRS = ("/usr", "/etc", "/opt")


def tools_missing() -> list[str]:
    return [t for t in TOOLS if not shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin")]


@dataclass(frozen=True)
class PodmanUser:
    """The test user's rootless Podman, its state inside the node's directory."""

    node: SimNode

    @property
    def home(self) -> Path:
        return self.node.root / "ph"

    @property
    def runtime_dir(self) -> Path:
        return self.node.root / "px"

    @property
    def rootfs(self) -> Path:
        return self.node.root / "pr"

    @property
    def conf(self) -> Path:
        return self.node.root / "containers.conf"

    def prepare(self) -> PodmanUser:
        user = ensure_test_user()
        for path in (self.home, self.runtime_dir, self.rootfs):
            path.mkdir(mode=0o700)
        for name in ("usr", "etc", "opt", "tmp", "proc", "sys", "dev", "run", *_top(REPO)):
            (self.rootfs / name).mkdir(parents=True, exist_ok=True)
        for link in ("bin", "sbin", "lib", "lib64"):
            if os.path.islink(f"/{link}"):
                (self.rootfs / link).symlink_to(os.readlink(f"/{link}"))
        self.conf.write_text(_CONF)
        self.conf.chmod(0o644)
        for path in (self.home, self.runtime_dir, self.rootfs):
            shutil.chown(path, user, user)
            for sub in path.rglob("*"):
                os.lchown(sub, *_ids(user))
        return self

    def env(self, **extra: str) -> dict[str, str]:
        """The node's environment for the test user, with Podman's."""
        return self.node.env(
            HOME=str(self.home),
            XDG_RUNTIME_DIR=str(self.runtime_dir),
            CONTAINERS_CONF=str(self.conf),
            **extra,
        )

    def argv(self, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
        """``argv`` as the test user with exactly ``env``, where Podman can run here."""
        return [*_NAMESPACE, _UNMOUNT, "sh", *user_argv(TEST_USER, argv, env)]

    def run(
        self, *args: str, timeout: float = 120, **extra: Any
    ) -> subprocess.CompletedProcess[str]:
        """``mpswrap ARGS`` as the test user, to its end."""
        return subprocess.run(
            self.argv([*MPSWRAP, *args], self.env(**extra)),
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            cwd=self.node.root,
            text=True,
            capture_output=True,
            timeout=timeout,
            check=False,
        )

    def start(self, *args: str, **extra: str) -> subprocess.Popen[str]:
        """``mpswrap ARGS`` as the test user, in a session of its own (a job step)."""
        return subprocess.Popen(
            self.argv([*MPSWRAP, *args], self.env(**extra)),
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            cwd=self.node.root,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def container_args(self, **extra: Any) -> list[str]:
        """What ``mpswrap container-args podman`` prints for the test user, as words."""
        res = self.run("container-args", "podman", **extra)
        assert res.returncode == 0, res.stderr
        return res.stdout.split()

    def podman(self, flags: Sequence[str], program: Sequence[str], shared: Path) -> list[str]:
        """``podman run`` of ``program`` with ``flags`` (the bind, the variables, a PID
        namespace or not), in a container whose root is the user's, with the host's
        programs and ``shared`` (where the program writes) bound in."""
        binds = [f"{d}:{d}:ro" for d in (*_HOST_DIRS, str(REPO), str(self.node.bin))]
        binds.append(f"{shared}:{shared}")
        return [
            "podman",
            "--cgroup-manager=cgroupfs",
            "run",
            "--rm",
            "--cgroups=disabled",
            "--net=none",
            *flags,
            *(w for b in binds for w in ("-v", b)),
            "--rootfs",  # last of the options: its path is the first positional word
            str(self.rootfs),
            *program,
        ]

    def close(self) -> None:
        """End the user's Podman pause process (it outlives every container, by design)."""
        pid_file = self.runtime_dir / "libpod" / "tmp" / "pause.pid"
        try:
            proc = psutil.Process(int(pid_file.read_text().strip()))
            mine = proc.username() == TEST_USER and proc.name() == "catatonit"
            if mine and proc.environ().get("XDG_RUNTIME_DIR") == str(self.runtime_dir):
                proc.kill()
                proc.wait(10)
        except (OSError, ValueError, psutil.Error):
            pass


def _top(path: Path) -> list[str]:
    """The first level of ``path`` below /, as a mount point in the container's root."""
    return [path.parts[1]] if len(path.parts) > 1 else []


def _ids(user: str) -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


def bwrap(binds: Sequence[str], program: Sequence[str], *, hide: Sequence[str] = ()) -> list[str]:
    """bubblewrap as Apptainer sets a container up by default: the host's root read-only,
    its own mount, PID and IPC namespaces, ``binds`` (paths bound at the same path) and
    ``hide`` (paths covered by an empty tmpfs)."""
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    argv += [w for path in hide for w in ("--tmpfs", path)]
    argv += [w for path in binds for w in ("--bind", path, path)]
    argv += ["--unshare-pid", "--unshare-ipc", "--die-with-parent", "--"]
    return [*argv, *program]


def line(argv: Sequence[str]) -> str:
    """A farm's task line for ``argv``."""
    return shlex.join(argv)
