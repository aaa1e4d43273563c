"""The local users tests run things as: created once per machine, and programs run as one of
them with exactly the environment a test gives (never this process's)."""

from __future__ import annotations

import pwd
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from filelock import FileLock

#: The job user of the functional tests.
TEST_USER = "mpswtest"
#: Another user of the same node: the one who must not reach the job.
OTHER_USER = "mpswtest2"
#: Held around "is the user there? else useradd": pytest-xdist workers are separate processes
#: and may ask for the same user at once (a second useradd fails: "already exists").
LOCK = Path("/tmp/mpswrap-test-users.lock")
#: runuser's own environment: it hands its program none of it (``env -i``).
_RUNUSER_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
#: Resolved here: a test's environment may lack /usr/sbin in PATH, or PATH at all.
RUNUSER = shutil.which("runuser", path=_RUNUSER_PATH) or "/usr/sbin/runuser"
#: What a test user's program needs at least: a PATH and a locale.
BASICS = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def ensure_user(name: str, *, home: bool = False) -> str:
    """The local user ``name``, created unless it exists (with a home directory if ``home``);
    its name. Safe when several processes ask for the same user at once."""
    if _exists(name):
        return name
    with FileLock(LOCK, timeout=60):
        if not _exists(name):
            made = ["-m"] if home else ["-M"]
            subprocess.run(["useradd", *made, "-s", "/bin/sh", name], check=True, timeout=60)
    return name


def ensure_test_user() -> str:
    return ensure_user(TEST_USER)


def ensure_other_user() -> str:
    return ensure_user(OTHER_USER)


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def basics(**extra: str) -> dict[str, str]:
    """The basic environment of a test user's program, plus ``extra``."""
    return {**BASICS, **extra}


def user_argv(user: str, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``argv`` as ``user`` with exactly ``env``: runuser keeps what ``env -i`` passes."""
    return [RUNUSER, "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()], *argv]


def run_as(
    user: str,
    argv: Sequence[str],
    env: Mapping[str, str] = BASICS,
    *,
    input: str | None = None,
    cwd: str | Path | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``user`` with exactly ``env``, to its end; its output captured."""
    return subprocess.run(
        user_argv(user, argv, env),
        env={"PATH": _RUNUSER_PATH},
        cwd=cwd,
        input=input,
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def popen_as(
    user: str,
    argv: Sequence[str],
    env: Mapping[str, str] = BASICS,
    *,
    cwd: str | Path | None = None,
    new_session: bool = False,
) -> subprocess.Popen[str]:
    """Start ``argv`` as ``user`` with exactly ``env``; its stdout and stderr in one pipe.
    runuser stays its parent: signal the whole session (``new_session``) to reach it."""
    return subprocess.Popen(
        user_argv(user, argv, env),
        env={"PATH": _RUNUSER_PATH},
        cwd=cwd,
        text=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=new_session,
    )


def spawn_as(user: str, argv: Sequence[str], **env: str) -> subprocess.Popen[str]:
    """Start ``argv`` as ``user`` directly, no runuser in between: its PID is the program's
    (a process a test wants the hooks to find and judge by its owner)."""
    entry = pwd.getpwnam(user)
    return subprocess.Popen(
        list(argv),
        env=basics(**env),
        user=entry.pw_uid,
        group=entry.pw_gid,
        extra_groups=[],
        cwd="/",
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
