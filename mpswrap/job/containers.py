"""Container runtimes as ranks: what each needs so that its client reaches the job's daemon,
and the check that a rank's command line gives it.

What a real client needs (H100, driver 580; docs/gpu-results/2026-11-25-containers): its
daemon's pipe directory **at the same path**, and the daemon's UID (mapped, where there is a
user namespace). IPC, PID and network namespaces and a private /dev/shm do not stop it.
Without the directory CUDA runs the program **without MPS, silently**; so a rank whose
program is a known runtime (``podman run …``, ``apptainer exec …``) is refused before
anything starts when its arguments do not bind the directory (or a parent of it) or do not
pass ``CUDA_MPS_PIPE_DIRECTORY``. A client in its own PID namespace is listed by the server
by its host PID. Podman and Docker start the container outside the runtime's process tree
(conmon, containerd): mpswrap finds such a client by the rank's tag (``jobenv.TREE_VAR``),
which the runtime must pass in as well.

``flags`` gives what a runtime needs (``mpswrap container-args RUNTIME``). Apptainer binds
nothing of the job by itself; its admins may add the run directory once (apptainer.conf
``bind path``): the task prolog exports no bind path, which would replace a user's own.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .._struct import Struct, field
from ..config import Settings
from ..errors import UsageError
from ..jobenv import TREE_VAR, JobEnv
from . import state

__all__ = ["PROGRAMS", "RUNTIMES", "Runtime", "View", "bind_dir", "check", "flags", "runtime_of"]

#: The variable a client finds its daemon by.
PIPE_VAR = "CUDA_MPS_PIPE_DIRECTORY"
#: What a runtime that clears the environment must pass in: the client's environment
#: (``mps.control.client_env``) and the Slurm job a rank's leftovers are judged by.
PASSED = (PIPE_VAR, "CUDA_MPS_LOG_DIRECTORY", "CUDA_VISIBLE_DEVICES", TREE_VAR, "SLURM_JOB_ID")
#: Shells a farm's task line runs in (``sh -c LINE``).
_SHELLS = frozenset({"sh", "bash", "dash"})


class View(Struct):
    """What a container of one command line sees of this host: the binds (source, target)
    and tmpfs mounts in order, and which variables it gets (``every``: all of ours)."""

    mounts: list[tuple[str, str | None]] = field(default_factory=list)  # tmpfs: (path, None)
    every: bool = False
    names: set[str] = field(default_factory=set)

    def bind(self, source: str, target: str | None = None) -> None:
        self.mounts.append((source, target or source))

    def shows(self, path: Path) -> bool:
        """Whether ``path`` is there at the same path: the last mount over it is a bind of
        itself or of a parent at the same path."""
        shown = False
        for source, target in self.mounts:
            where = target or source
            if _within(path, where):
                shown = target is not None and _same(source, target)
        return shown

    def passes(self, name: str) -> bool:
        return self.every or name in self.names


def _within(path: Path, top: str) -> bool:
    return Path(os.path.normpath(top)) in (path, *path.parents)


def _same(source: str, target: str) -> bool:
    return os.path.normpath(source) == os.path.normpath(target)


class Runtime(Struct, frozen=True):
    """A container runtime: how to read its command line and what to give it."""

    name: str
    programs: frozenset[str]
    verbs: frozenset[str]  # its subcommands that start a container (none: the program does)
    view: Callable[[Sequence[str], Mapping[str, str]], View]
    bind_flag: Callable[[str], list[str]]
    env_flag: Callable[[str], list[str]]
    #: Its container's processes are not descendants of the runtime's process.
    detached: bool = False
    #: What ``flags`` adds besides the bind and the variables (``uid``: the caller's).
    own: Callable[[int], list[str]] = lambda uid: []


# --- reading command lines ---------------------------------------------------------------
def _options(
    args: Sequence[str], valued: frozenset[str], arity: Mapping[str, int] | None = None
) -> list[tuple[str, list[str]]]:
    """(option, its values) up to the first word that is no option (the image, the
    program): ``--opt=value`` and ``-o value`` alike."""
    found: list[tuple[str, list[str]]] = []
    index = 0
    while index < len(args) and args[index].startswith("-") and args[index] != "--":
        word = args[index]
        name, eq, value = word.partition("=")
        count = (arity or {}).get(name, 1 if name in valued else 0)
        if eq and name.startswith("--"):
            found.append((name, [value]))
            index += 1
        else:
            found.append((word, list(args[index + 1 : index + 1 + count])))
            index += 1 + count
    return found


def _words(text: str) -> frozenset[str]:
    """A table of a runtime's option names, written as words."""
    return frozenset(text.split())


_PODMAN_VALUED = _words(
    "-a --add-host --annotation --arch --attach --authfile --blkio-weight "
    "--blkio-weight-device --cap-add --cap-drop --cgroup-conf --cgroup-parent --cgroupns "
    "--cgroups --chrootdirs --cidfile --conmon-pidfile --cpu-period --cpu-quota "
    "--cpu-rt-period --cpu-rt-runtime --cpu-shares -c --cpus --cpuset-cpus --cpuset-mems "
    "--decryption-key --detach-keys --device --device-cgroup-rule --device-read-bps "
    "--device-read-iops --device-write-bps --device-write-iops --dns --dns-opt --dns-option "
    "--dns-search --entrypoint -e --env --env-file --expose --gidmap --gpus --group-add "
    "--group-entry --health-cmd --health-interval --health-retries --health-start-period "
    "--health-timeout -h --hostname --hostuser --init-path --ip --ip6 --ipc --isolation -l "
    "--label --label-file --link --log-driver --log-opt --mac-address -m --memory "
    "--memory-reservation --memory-swap --memory-swappiness --mount --name --net --network "
    "--network-alias --oom-score-adj --os --passwd-entry --personality --pid --pidfile "
    "--pids-limit --platform --pod --pod-id-file -p --publish --preserve-fds --pull "
    "--requires --restart --runtime --sdnotify --seccomp-policy --secret --security-opt "
    "--shm-size --stop-signal --stop-timeout --storage-opt --subgidname --subuidname --sysctl "
    "--systemd --timeout --tmpfs --tz -u --uidmap --ulimit --umask --user --userns --uts "
    "--variant -v --volume --volume-driver --volumes-from -w --workdir"
)


def _podman_view(args: Sequence[str], environ: Mapping[str, str]) -> View:
    view = View()
    for name, values in _options(args, _PODMAN_VALUED):
        value = values[0] if values else ""
        if name in ("-v", "--volume") and value.startswith("/"):
            source, _, rest = value.partition(":")
            view.bind(source, rest.partition(":")[0] or source)
        elif name == "--mount":
            _podman_mount(view, value)
        elif name == "--tmpfs":
            view.mounts.append((value.partition(":")[0], None))
        elif name in ("-e", "--env"):
            view.names.add(value.partition("=")[0])
        elif name in ("--env-host", "--env-file"):  # a file: what it holds is not ours to read
            view.every = True
    # Podman and Docker mount in order of depth, not of the command line: a bind below a
    # tmpfs shows through it.
    view.mounts.sort(key=lambda mount: len(Path(mount[1] or mount[0]).parts))
    return view


def _podman_mount(view: View, spec: str) -> None:
    parts = dict(p.partition("=")[::2] for p in spec.split(","))
    source = parts.get("source") or parts.get("src") or ""
    target = parts.get("target") or parts.get("destination") or parts.get("dst") or ""
    if parts.get("type") == "bind" and source.startswith("/") and target:
        view.bind(source, target)
    elif parts.get("type") == "tmpfs" and target:
        view.mounts.append((target, None))


_APPTAINER_VALUED = _words(
    "--app -B --bind --mount --env --env-file -H --home -o --overlay -S --scratch -W "
    "--workdir --security --network --network-args --dns --hostname --pwd --fusemount "
    "--apply-cgroups --cpus --memory --no-mount --add-caps --drop-caps"
)
#: What Apptainer binds by itself (its default ``bind path``s and ``mount tmp``/``home``).
_APPTAINER_DEFAULT = ("/tmp", "/var/tmp")


def _apptainer_view(args: Sequence[str], environ: Mapping[str, str]) -> View:
    view, options = View(every=True), _options(args, _APPTAINER_VALUED)
    names = {n for n, _ in options}
    if not names & {"-c", "--contain", "-C", "--containall"}:
        kept = [d for d in _APPTAINER_DEFAULT if "tmp" not in _no_mount(options)]
        home = environ.get("HOME", "")
        kept += [home] if home.startswith("/") and "home" not in _no_mount(options) else []
        for path in kept:
            view.bind(path)
    for var in ("APPTAINER_BINDPATH", "SINGULARITY_BINDPATH", "APPTAINER_BIND"):
        _apptainer_binds(view, environ.get(var, ""))
    for name, values in options:
        if name in ("-B", "--bind"):
            _apptainer_binds(view, values[0] if values else "")
        elif name == "--mount":
            _podman_mount(view, values[0] if values else "")
        elif name in ("-e", "--cleanenv", "-C", "--containall"):
            view.every = False
        elif name == "--env":
            view.names.update(v.partition("=")[0] for v in (values or [""])[0].split(","))
        elif name == "--env-file":
            view.every = True
    view.names.update(k.split("ENV_", 1)[1] for k in environ if k.endswith(f"ENV_{PIPE_VAR}"))
    return view


def _no_mount(options: Sequence[tuple[str, list[str]]]) -> set[str]:
    return {w for n, v in options if n == "--no-mount" for w in (v or [""])[0].split(",")}


def _apptainer_binds(view: View, specs: str) -> None:
    for spec in filter(None, specs.split(",")):
        source, _, rest = spec.partition(":")
        if source.startswith("/"):
            view.bind(source, rest.partition(":")[0] or source)


_ENROOT_VALUED = _words("-c --conf -e --env -m --mount --rc")


def _enroot_view(args: Sequence[str], environ: Mapping[str, str]) -> View:
    # Only the mount is checked: what enroot passes of the environment depends on its
    # configuration (``-e NAME`` passes a variable in either way).
    view = View(every=True)
    for name, values in _options(args, _ENROOT_VALUED):
        if name in ("-m", "--mount") and values:
            source, _, target = values[0].replace(" ", ":", 1).partition(":")
            view.bind(source, target.split(" ")[0] or source)
    return view


#: bubblewrap's options and how many arguments each takes (those not named take none).
_BWRAP_ARITY = {
    **dict.fromkeys(
        _words(
            "--args --chdir --dir --tmpfs --proc --dev --mqueue --remount-ro --hostname --uid "
            "--gid --userns --userns2 --pidns --seccomp --add-seccomp-fd --exec-label "
            "--file-label --lock-file --sync-fd --info-fd --json-status-fd --block-fd "
            "--userns-block-fd --cap-add --cap-drop --perms --size --argv0 --unsetenv "
            "--overlay-src --tmp-overlay --ro-overlay"
        ),
        1,
    ),
    **dict.fromkeys(
        _words(
            "--bind --bind-try --dev-bind --dev-bind-try --ro-bind --ro-bind-try --setenv "
            "--symlink --file --bind-data --ro-bind-data --chmod --bind-fd --ro-bind-fd "
            "--overlay"
        ),
        2,
    ),
}


def _bwrap_view(args: Sequence[str], environ: Mapping[str, str]) -> View:
    view = View(every=True)
    for name, values in _options(args, frozenset(), _BWRAP_ARITY):
        if name.endswith(("bind", "bind-try")) and len(values) == 2:
            view.bind(values[0], values[1])
        elif name in ("--tmpfs", "--dir", "--proc", "--dev") and values:
            view.mounts.append((values[0], None))
        elif name == "--clearenv":
            view.every, view.names = False, set()
        elif name == "--setenv" and values:
            view.names.add(values[0])
        elif name == "--unsetenv" and values:
            view.names.discard(values[0])
            view.every = view.every and values[0] != PIPE_VAR
    return view


def _rootless(uid: int) -> list[str]:
    # Rootless: the client keeps the caller's UID inside, as the daemon serves only it.
    return [] if uid == 0 else ["--userns=keep-id"]


RUNTIMES: tuple[Runtime, ...] = (
    Runtime(
        "podman",
        frozenset({"podman"}),
        frozenset({"run"}),
        _podman_view,
        lambda d: ["-v", f"{d}:{d}"],
        lambda n: ["-e", n],
        detached=True,
        own=_rootless,
    ),
    Runtime(
        "docker",
        frozenset({"docker"}),
        frozenset({"run"}),
        _podman_view,
        lambda d: ["-v", f"{d}:{d}"],
        lambda n: ["-e", n],
        detached=True,
        # Docker's daemon starts containers as root: the client must run as the daemon's UID.
        own=lambda uid: ["--user", f"{uid}:{os.getgid()}"],
    ),
    Runtime(
        "apptainer",
        frozenset({"apptainer", "singularity"}),
        frozenset({"exec", "run", "shell"}),
        _apptainer_view,
        lambda d: ["--bind", d],
        lambda n: ["--env", f"{n}=${n}"],
    ),
    Runtime(
        "enroot",
        frozenset({"enroot"}),
        frozenset({"start"}),
        _enroot_view,
        lambda d: ["--mount", f"{d}:{d}"],
        lambda n: ["-e", n],
    ),
    Runtime(
        "bwrap",
        frozenset({"bwrap"}),
        frozenset(),
        _bwrap_view,
        lambda d: ["--bind", d, d],
        lambda n: ["--setenv", n, f"${n}"],
    ),
)


#: The programs ``container-args`` takes, in the table's order.
PROGRAMS = tuple(p for r in RUNTIMES for p in sorted(r.programs))


def runtime_named(name: str) -> Runtime:
    for runtime in RUNTIMES:
        if name == runtime.name or name in runtime.programs:
            return runtime
    names = ", ".join(r.name for r in RUNTIMES)
    raise UsageError("unknown container runtime", thing=name, hint=f"one of: {names}")


def runtime_of(argv: Sequence[str]) -> tuple[Runtime, list[str]] | None:
    """The runtime a command line starts a container with, and the runtime's arguments
    after its verb; None for any other program. A shell's ``-c LINE`` (a farm's task) is
    read when its first word is a runtime and nothing in it is expanded at run time."""
    words = list(argv)
    if len(words) >= 3 and os.path.basename(words[0]) in _SHELLS and words[1] == "-c":
        if any(c in words[2] for c in "$`"):
            return None
        try:
            words = shlex.split(words[2])
        except ValueError:
            return None
    name = os.path.basename(words[0]) if words else ""
    runtime = next((r for r in RUNTIMES if name in r.programs), None)
    if runtime is None:
        return None
    if not runtime.verbs:
        return runtime, words[1:]
    rest = list(words[1:])
    while rest and rest[0].startswith("-"):  # the runtime's global options (no values read)
        rest.pop(0)
    if not rest or rest[0] not in runtime.verbs:
        return None
    return runtime, rest[1:]


# --- the check ---------------------------------------------------------------------------
def check(argv: Sequence[str], pipes: Sequence[Path], environ: Mapping[str, str]) -> None:
    """Refuse (exit 2, one line) a runtime's command line whose container would not reach the
    daemons of ``pipes``: the directory not bound at the same path, or the variables that
    lead the client there (and, for a runtime that starts it outside its tree, that let
    mpswrap find it) not passed in."""
    found = runtime_of(argv)
    if found is None or not pipes:
        return
    runtime, args = found
    view = runtime.view(args, environ)
    shared = Path(os.path.commonpath([str(p.parent.parent) for p in pipes]))
    hint = f"or $(mpswrap container-args {runtime.name})"
    for pipe in pipes:
        if not view.shows(pipe):
            raise UsageError(
                f"{runtime.name} does not bind the MPS pipe directory at the same path",
                thing=str(pipe),
                cause="its client would run without MPS; add "
                f"{shlex.join(runtime.bind_flag(str(shared)))}, {hint}",
            )
    needed = [PIPE_VAR, *([TREE_VAR] if runtime.detached else [])]
    for name in (n for n in needed if not view.passes(n)):
        why = (
            "its client would run without MPS"
            if name == PIPE_VAR
            else f"mpswrap could neither verify nor end its client ({runtime.name} starts it "
            "outside this process tree)"
        )
        raise UsageError(
            f"{runtime.name} does not pass {name} into the container",
            cause=f"{why}; add {shlex.join(runtime.env_flag(name))}, {hint}",
        )


# --- what a runtime needs ----------------------------------------------------------------
def bind_dir(settings: Settings, env: JobEnv, job: str | None = None) -> Path:
    """The directory that holds the pipe directories a rank may get: the job's (``--job``,
    the launcher's, Slurm's) where it has daemons here; else, outside a job, this user's
    node directory, which holds every user-mode job a later ``mpswrap run`` starts."""
    key = env.job_key(job)
    if key is not None:
        found = state.job_layouts(settings, env.node, key, os.getuid())
        if found:
            return found[0].job_dir
        if job is not None:
            raise UsageError(
                "no MPS daemons of this job here",
                thing=f"job {key} on {env.node}",
                hint="start them first (mpswrap start --job ID), or leave out --job",
            )
    return state.user_layout(settings, env.node, "local").node_dir


def flags(runtime: Runtime, directory: Path, uid: int) -> list[str]:
    """The runtime's arguments that let a rank's client in a container reach its daemon."""
    out = list(runtime.bind_flag(str(directory)))
    if runtime.name not in ("apptainer", "bwrap"):  # those pass our environment by default
        for name in PASSED:
            out += runtime.env_flag(name)
    if runtime.name in ("podman", "docker"):
        # Signals reach the client through mpswrap's ladder (terminate_client first), never
        # forwarded by the runtime (a signal to a busy client can wedge its server). No
        # --ipc=host: driver 580 does not need the host's IPC namespace (older drivers did,
        # NVIDIA/nvidia-docker#419: docs/howto-containers.md).
        out.append("--sig-proxy=false")
    return out + runtime.own(uid)
