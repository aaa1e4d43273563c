"""Settings with explicit precedence: argument > ``MPSWRAP_*`` > admin file > default.

The admin file (``MPSWRAP_CONFIG`` or ``/etc/mpswrap/mpswrap.conf``) holds ``key = value``
lines; ``#`` starts a comment. Root reads it only while no other user can change it or a
directory above it (``trust``): else it is a problem, and every value keeps its default.
Unknown keys and bad values are errors that name the valid choices. ``Settings.describe()``
shows every resolved value and where it came from.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType

from . import trust
from ._struct import Struct
from .errors import ConfigError
from .values import (
    Parser,
    abs_path,
    boolean,
    cgroup_root,
    choice,
    clients,
    days,
    farm_profile,
    grace,
    inventory,
    mem_size,
    optional,
    percent,
    priority,
    program,
    seconds,
    triggers,
)

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any, Literal

__all__ = ["DEFAULT_CONFIG_FILE", "FIELDS", "Settings", "admin_file", "load_settings"]

log = logging.getLogger(__name__)

DEFAULT_CONFIG_FILE = "/etc/mpswrap/mpswrap.conf"
ENV_PREFIX = "MPSWRAP_"
#: The variables besides the settings' own, as the reference and the man page list them:
#: (names, who sets them, what they mean).
OTHER_VARIABLES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"),
        "mpswrap, for each client",
        "its GPU's daemon",
    ),
    (("CUDA_VISIBLE_DEVICES",), "mpswrap, for each client", "that GPU's UUID"),
    (
        (
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            "CUDA_MPS_CLIENT_PRIORITY",
        ),
        "mpswrap with --threads, --mem-limit, --priority",
        "per-client provisioning",
    ),
    (
        ("MPSWRAP_RANK", "MPSWRAP_LOCAL_RANK", "MPSWRAP_NPROCS", "MPSWRAP_LOCAL_SIZE"),
        "mpswrap run (or you, for a launcher mpswrap does not know)",
        "rank numbers",
    ),
    (
        ("MPSWRAP_TASK", "MPSWRAP_TASK_ATTEMPT"),
        "mpswrap farm, for each task",
        "the task's number in the task list (from 0) and which run of it this is (from 1)",
    ),
    (("MPSWRAP_JOB",), "prefix mode for mpirun", "a job id shared by the ranks of one launch"),
    (("MPSWRAP_CONFIG",), "admin / hook shims", "admin config file"),
    (("MPSWRAP_DEBUG",), "user", "1: debug logs and tracebacks (as --debug)"),
    (("MPSWRAP_SIM_FAULTS",), "tests", "the simulator's fault file (mpswrap/sim/_faults.py)"),
)

#: Variables with the prefix that are not settings.
_NOT_SETTINGS = {
    "MPSWRAP_CONFIG",
    "MPSWRAP_RANK",
    "MPSWRAP_LOCAL_RANK",
    "MPSWRAP_NPROCS",
    "MPSWRAP_LOCAL_SIZE",
    "MPSWRAP_JOB",
    "MPSWRAP_DEBUG",
    "MPSWRAP_TREE",
    "MPSWRAP_RANK_VARS",
}


class Field(Struct, frozen=True):
    name: str
    parse: Parser
    default: str
    doc: str


FIELDS: tuple[Field, ...] = (
    Field("run_dir", abs_path, "/run/mpswrap", "root of per-job state for hooks (admin mode)"),
    Field(
        "user_run_dir",
        optional(abs_path),
        "none",
        "root of per-job state in user mode (none: $XDG_RUNTIME_DIR/mpswrap or /tmp/mpswrap-UID)",
    ),
    Field(
        "control_binary",
        program,
        "nvidia-cuda-mps-control",
        "MPS control program (name or path)",
    ),
    Field("gpu_inventory", inventory, "nvml", "nvml, or a JSON inventory file (simulation)"),
    Field(
        "inventory_cache",
        boolean,
        "yes",
        "prolog: keep NVML's inventory for the boot in run_dir, read it instead of NVML",
    ),
    Field("client_limit", clients, "auto", "MPS clients per GPU: auto (by architecture) or N"),
    Field(
        "gpu_policy",
        choice("block", "cyclic", "affinity"),
        "block",
        "how local ranks map to GPUs",
    ),
    Field(
        "prolog_mode",
        choice("always", "opt-in", "never"),
        "opt-in",
        "when the prolog starts MPS",
    ),
    Field(
        "opt_in",
        triggers,
        "gres-mps, spank, feature:mps, comment:mps",
        "what makes a job opt in (prolog_mode = opt-in)",
    ),
    Field(
        "prolog_failure",
        choice("drain", "continue"),
        "continue",
        "drain: fail the prolog (Slurm drains the node); continue: run the job without MPS",
    ),
    Field(
        "epilog_failure",
        choice("drain", "continue"),
        "drain",
        "drain: fail the epilog if anything of the job survives teardown",
    ),
    Field("cpu_binding", boolean, "yes", "pin each daemon to its GPU's local CPUs among the job's"),
    Field(
        "exclusive_process",
        boolean,
        "no",
        "prolog: a job's whole GPUs in compute mode EXCLUSIVE_PROCESS; epilog: the mode found",
    ),
    Field(
        "prestart_server",
        boolean,
        "no",
        "start the user's MPS server before the first client",
    ),
    Field(
        "active_thread_percentage",
        optional(percent),
        "none",
        "default active thread %",
    ),
    Field(
        "pinned_mem_limit",
        optional(mem_size),
        "none",
        "default device pinned memory limit",
    ),
    Field(
        "client_priority",
        optional(priority),
        "none",
        "default client priority (0 or 1)",
    ),
    Field("start_timeout", seconds, "15", "seconds for a daemon to answer after start"),
    Field("command_timeout", seconds, "10", "seconds for one control command"),
    Field(
        "terminate_timeout",
        seconds,
        "5",
        "seconds for clients to exit after terminate_client",
    ),
    Field(
        "terminate_window",
        seconds,
        "0.5",
        "seconds of terminate_client, one client at a time, before a server whose clients "
        "all end is shut down with the rest (shutdown_server -f)",
    ),
    Field("quit_timeout", seconds, "5", "seconds for quit before killing by PID"),
    Field(
        "teardown_deadline",
        seconds,
        "30",
        "seconds the epilog's whole teardown may take: every command, wait and scan of it "
        "draws from them (keep well under Slurm's EpilogTimeout / PrologEpilogTimeout)",
    ),
    Field(
        "cgroup_root",
        cgroup_root,
        "auto",
        "where root starts each job's daemons in a cgroup v2 of its own: auto (the folder "
        "mpswrap below the cgroup2 mount), a folder there, or none (root's record alone)",
    ),
    Field("kill_grace", grace, "10", "seconds between a forwarded signal and SIGKILL"),
    Field(
        "log_archive",
        optional(abs_path),
        "none",
        "keep each daemon's control.log, server.log and record here (mpswrap report)",
    ),
    Field(
        "log_archive_days",
        optional(days),
        "30",
        "days log_archive keeps mpswrap's records and logs (none: kept forever)",
    ),
    Field(
        "verify_attach",
        choice("warn", "fail", "off"),
        "warn",
        "a rank that is not an MPS client: warn, fail (exit 69) or off (not checked)",
    ),
    Field("health_check", boolean, "no", "epilog: run a GPU health check after teardown"),
    Field("syslog", boolean, "yes", "hooks: log to syslog as well as stderr"),
    Field("log_level", choice("debug", "info", "warning", "error"), "info", "log level"),
    Field(
        "farm_profile",
        farm_profile,
        "auto",
        "what farms learned of known commands, per user: auto ($XDG_CACHE_HOME/mpswrap/"
        "farm-profile.json), off, or a file",
    ),
)
_BY_NAME = {f.name: f for f in FIELDS}


def _spec(name: str, where: str) -> Field:
    spec = _BY_NAME.get(name)
    if spec is None:
        raise ConfigError(
            "unknown setting",
            thing=f"{name} in {where}",
            hint=f"valid settings: {', '.join(sorted(_BY_NAME))}",
        )
    return spec


def _parse(name: str, text: str, where: str) -> object:
    spec = _spec(name, where)
    try:
        if not text.isprintable():  # a line break or escape would reach logs and argv
            raise ValueError("contains a control character")
        return spec.parse(text.strip())
    except ValueError as exc:
        raise ConfigError(
            f"bad value for {name}", thing=f"{text!r} in {where}", cause=str(exc)
        ) from exc


def _problem(exc: ConfigError, problems: list[ConfigError] | None) -> None:
    """Raise ``exc``, or note it in ``problems`` when the caller collects them."""
    if problems is None:
        raise exc
    problems.append(exc)


#: An admin file is a few dozen lines; a larger one is no admin file of mpswrap's.
CONFIG_LIMIT = 1 << 20


def _read_text(path: Path) -> str:
    """The file's text: a regular file (never blocking on a FIFO, never reading a device) of
    at most ``CONFIG_LIMIT`` bytes, UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ConfigError("cannot read config file", thing=str(path), cause="not a file")
            data = handle.read(CONFIG_LIMIT + 1)
        if len(data) > CONFIG_LIMIT:
            cause = f"larger than {CONFIG_LIMIT >> 20} MiB"
            raise ConfigError("cannot read config file", thing=str(path), cause=cause)
        return data.decode("utf-8")
    except OSError as exc:
        cause = exc.strerror or str(exc)
        raise ConfigError("cannot read config file", thing=str(path), cause=cause) from exc
    except UnicodeDecodeError as exc:
        cause = "not UTF-8 text"
        raise ConfigError("cannot read config file", thing=str(path), cause=cause) from exc


#: A comment: from a ``#`` at the line's start or after a blank to the line's end, as INI
#: files have them; a ``#`` inside a value (``/tmp/a#b``) belongs to the value.
_COMMENT = re.compile(r"(^|\s)#.*")


def read_config_file(path: Path, problems: list[ConfigError] | None = None) -> dict[str, str]:
    """Parse an admin file into raw strings; errors name the file and line (a bad line is
    noted in ``problems`` and skipped, when given)."""
    values: dict[str, str] = {}
    for number, raw in enumerate(_read_text(path).splitlines(), 1):
        line = _COMMENT.sub("", raw).strip()
        if not line or line == "[mpswrap]":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            error = ConfigError("expected key = value", thing=f"{path}:{number}", cause=repr(raw))
            _problem(error, problems)
            continue
        values[key.strip()] = value.strip()
    return values


class Settings(Struct, frozen=True):
    """Resolved settings: one typed attribute per entry of ``FIELDS``, in the same order.

    Names, parsers, defaults and docs are written only in ``FIELDS``; this class adds just
    the static types, and a unit test keeps its attributes and ``FIELDS`` in step.
    """

    run_dir: str
    user_run_dir: str | None
    control_binary: str
    gpu_inventory: str
    inventory_cache: bool
    client_limit: int | Literal["auto"]
    gpu_policy: str
    prolog_mode: Literal["always", "opt-in", "never"]
    opt_in: tuple[str, ...]
    prolog_failure: Literal["drain", "continue"]
    epilog_failure: Literal["drain", "continue"]
    cpu_binding: bool
    exclusive_process: bool
    prestart_server: bool
    active_thread_percentage: float | None
    pinned_mem_limit: str | None
    client_priority: int | None
    start_timeout: float
    command_timeout: float
    terminate_timeout: float
    terminate_window: float
    quit_timeout: float
    teardown_deadline: float
    cgroup_root: str
    kill_grace: float
    log_archive: str | None
    log_archive_days: float | None
    verify_attach: Literal["warn", "fail", "off"]
    health_check: bool
    syslog: bool
    log_level: str
    farm_profile: str
    #: Where each value came from: ``default``, ``file PATH``, ``env VAR`` or ``argument``.
    sources: Mapping[str, str]

    @property
    def values(self) -> Mapping[str, object]:
        """Every setting by name, read-only, for code that walks all of them."""
        return MappingProxyType({f.name: getattr(self, f.name) for f in FIELDS})

    def replace(self, **overrides: object) -> Settings:
        """A copy with explicit overrides (already parsed values or strings)."""
        values, sources = dict(self.values), dict(self.sources)
        for name, value in overrides.items():
            if value is None:
                continue  # an option the caller left unset keeps the resolved value
            values[name] = _override(name, value)
            sources[name] = "argument"
        return _settings(values, sources)

    def describe(self) -> list[tuple[str, str, str]]:
        """Rows of (name, value, source) for ``mpswrap config``."""
        values = self.values
        return [(f.name, _show(values[f.name]), self.sources[f.name]) for f in FIELDS]


def _override(name: str, value: object) -> object:
    if isinstance(value, str):
        return _parse(name, value, "argument")
    _spec(name, "argument")  # an already parsed value must still name a setting
    return value


def _settings(values: Mapping[str, object], sources: Mapping[str, str]) -> Settings:
    # Parsers are typed ``str -> object`` so that one table can hold them all; each returns
    # its attribute's declared type (tests/unit/test_config.py checks this), so the values
    # go in unchecked rather than re-validated here.
    typed: dict[str, Any] = dict(values)
    return Settings(**typed, sources=dict(sources))


def _show(value: object) -> str:
    if isinstance(value, tuple):
        return ", ".join(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "none" if value is None else str(value)


def admin_file(env: Mapping[str, str], config_file: str | None = None) -> str:
    """The admin file's path: ``config_file``, else ``MPSWRAP_CONFIG``, else the default."""
    return config_file or env.get("MPSWRAP_CONFIG") or DEFAULT_CONFIG_FILE


def _file_layer(
    env: Mapping[str, str], config_file: str | None, problems: list[ConfigError] | None
) -> Iterator[tuple[str, str, str]]:
    """(name, text, where) for each line of the admin file, when there is one to read."""
    path = admin_file(env, config_file)
    explicit = bool(config_file or env.get("MPSWRAP_CONFIG"))
    # Only a file someone named must exist; the default location is optional.
    if not explicit and not os.path.exists(path):
        return
    try:
        # Root's own directory or FIFO (every level above it root's): reading it says "not a
        # file". Any level another user may change is refused before it is opened.
        if trust.is_root() and os.path.exists(path):
            level = trust.changeable_level(path)
            if level is not None and not level.endswith(" (not a regular file)"):
                trust.check_root_file(path, "admin config file")
        lines = read_config_file(Path(path), problems)
    except ConfigError as exc:
        _problem(exc, problems)
        return
    for name, text in lines.items():
        yield name, text, path


def _env_layer(env: Mapping[str, str]) -> Iterator[tuple[str, str, str]]:
    """(name, text, variable) for each ``MPSWRAP_*`` variable that is a setting. Another
    ``MPSWRAP_*`` variable is named in a warning and ignored: one stray variable in a
    user's environment must not stop every command (``stop`` included)."""
    for var, text in env.items():
        if var.startswith(ENV_PREFIX) and var not in _NOT_SETTINGS:
            name = var[len(ENV_PREFIX) :].lower()
            if name.startswith("sim_"):
                continue  # the simulator's own variables
            if name in _BY_NAME:
                yield name, text, var
            elif var not in _WARNED:
                _WARNED.add(var)
                import difflib

                near = difflib.get_close_matches(name, _BY_NAME, n=1)
                guess = f" (did you mean {ENV_PREFIX}{near[0].upper()}?)" if near else ""
                log.warning("ignoring %s: not a setting%s", var, guess)


#: Unknown variables already warned about (settings are loaded several times a command).
_WARNED: set[str] = set()


def load_settings(
    overrides: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | None = None,
    problems: list[ConfigError] | None = None,
) -> Settings:
    """Resolve settings: ``overrides`` > ``MPSWRAP_*`` in ``env`` > admin file > defaults.

    With ``problems`` (the hooks), what cannot be read or parsed is noted there and keeps
    its default instead of raising: a hook then acts on what it can, by its contract.
    """
    env = os.environ if env is None else env
    values = {f.name: f.parse(f.default) for f in FIELDS}
    sources = {f.name: "default" for f in FIELDS}
    layers = [(n, t, w, f"file {w}") for n, t, w in _file_layer(env, config_file, problems)]
    layers += [(n, t, w, f"env {w}") for n, t, w in _env_layer(env)]
    for name, text, where, source in layers:
        try:
            values[name] = _parse(name, text, where)
        except ConfigError as exc:
            _problem(exc, problems)
            continue
        sources[name] = source
    return _settings(values, sources).replace(**(overrides or {}))
