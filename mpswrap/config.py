"""Settings with explicit precedence: argument > ``MPSWRAP_*`` > admin file > default.

The admin file (``MPSWRAP_CONFIG`` or ``/etc/mpswrap/mpswrap.conf``) holds ``key = value``
lines; ``#`` starts a comment. Unknown keys and bad values are errors that name the valid
choices. ``Settings.describe()`` shows every resolved value and where it came from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Literal, cast

from .errors import ConfigError

__all__ = ["DEFAULT_CONFIG_FILE", "FIELDS", "Settings", "load_settings"]

DEFAULT_CONFIG_FILE = "/etc/mpswrap/mpswrap.conf"
ENV_PREFIX = "MPSWRAP_"
#: Variables with the prefix that are not settings.
_NOT_SETTINGS = {
    "MPSWRAP_CONFIG",
    "MPSWRAP_RANK",
    "MPSWRAP_LOCAL_RANK",
    "MPSWRAP_NPROCS",
    "MPSWRAP_LOCAL_SIZE",
    "MPSWRAP_JOB",
    "MPSWRAP_DEBUG",
}

#: Turns admin text into a value of its setting's attribute type (``Settings`` declares it).
Parser = Callable[[str], object]


def _choice(*choices: str) -> Parser:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return text

    return parse


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "yes", "true", "on"):
        return True
    if low in ("0", "no", "false", "off"):
        return False
    raise ValueError("expected yes or no")


def _number(text: str, error: str) -> float:
    """A plain decimal (``15``, ``2.5``): not ``nan``, ``inf``, ``1e3`` nor ``1_0``."""
    if not re.fullmatch(r"[0-9]{1,6}(\.[0-9]{1,6})?", text):
        raise ValueError(error)
    return float(text)


def _seconds(text: str) -> float:
    error = "expected seconds between 0 and 3600"
    value = _number(text, error)
    if not 0 < value <= 3600:
        raise ValueError(error)
    return value


def _optional(parse: Parser) -> Parser:
    def wrapped(text: str) -> object:
        return None if text.lower() in ("", "none", "off") else parse(text)

    return wrapped


def _percent(text: str) -> float:
    error = "expected a percentage in (0, 100]"
    value = _number(text, error)
    if not 0 < value <= 100:
        raise ValueError(error)
    return value


def _limit(text: str) -> int | Literal["auto"]:
    if text == "auto":
        return "auto"
    error = "expected auto or a number of clients from 1 to 128"
    if not re.fullmatch(r"[0-9]{1,3}", text) or not 1 <= int(text) <= 128:
        raise ValueError(error)
    return int(text)


def _mem(text: str) -> str:
    digits, unit = text[:-1], text[-1:].upper()
    if unit not in ("M", "G") or not re.fullmatch(r"[0-9]{1,9}", digits) or int(digits) == 0:
        raise ValueError("expected a size like 512M or 2G")
    return f"{int(digits)}{unit}"


def _abs_path(text: str) -> str:
    if not os.path.isabs(text):
        raise ValueError("expected an absolute path")
    return os.path.normpath(text)


def _inventory(text: str) -> str:
    return text if text == "nvml" else _abs_path(text)


def _program(text: str) -> str:
    """A program name looked up in a fixed PATH, or an absolute path (never a relative one:
    root runs it, from whatever directory)."""
    if os.path.isabs(text):
        return os.path.normpath(text)
    if not re.fullmatch(r"[A-Za-z0-9._+-]+", text):
        raise ValueError("expected a program name or an absolute path")
    return text


def _triggers(text: str) -> tuple[str, ...]:
    items = tuple(t.strip() for t in text.split(",") if t.strip())
    for item in items:
        kind, _, name = item.partition(":")
        if item != "gres-mps" and (kind not in ("feature", "comment") or not name):
            raise ValueError("expected a list of gres-mps, feature:<name>, comment:<word>")
    return items


def _priority(text: str) -> int:
    if text not in ("0", "1"):
        raise ValueError("expected 0 (normal) or 1 (below normal)")
    return int(text)


@dataclass(frozen=True)
class Field:
    name: str
    parse: Parser
    default: str
    doc: str


FIELDS: tuple[Field, ...] = (
    Field("run_dir", _abs_path, "/run/mpswrap", "root of per-job state for hooks (admin mode)"),
    Field(
        "user_run_dir",
        _optional(_abs_path),
        "none",
        "root of per-job state in user mode (none: $XDG_RUNTIME_DIR/mpswrap or /tmp/mpswrap-UID)",
    ),
    Field(
        "control_binary", _program, "nvidia-cuda-mps-control", "MPS control program (name or path)"
    ),
    Field("gpu_inventory", _inventory, "nvml", "nvml, or a JSON inventory file (simulation)"),
    Field("client_limit", _limit, "auto", "MPS clients per GPU: auto (by architecture) or N"),
    Field(
        "gpu_policy", _choice("block", "cyclic", "affinity"), "block", "how local ranks map to GPUs"
    ),
    Field(
        "prolog_mode", _choice("always", "opt-in", "never"), "opt-in", "when the prolog starts MPS"
    ),
    Field(
        "opt_in",
        _triggers,
        "gres-mps, feature:mps, comment:mps",
        "what makes a job opt in (prolog_mode = opt-in)",
    ),
    Field(
        "prolog_failure",
        _choice("drain", "continue"),
        "continue",
        "drain: fail the prolog (Slurm drains the node); continue: run the job without MPS",
    ),
    Field(
        "epilog_failure",
        _choice("drain", "continue"),
        "drain",
        "drain: fail the epilog if anything of the job survives teardown",
    ),
    Field("cpu_binding", _bool, "yes", "pin each daemon to its GPU's local CPUs"),
    Field("prestart_server", _bool, "no", "start the user's MPS server before the first client"),
    Field("active_thread_percentage", _optional(_percent), "none", "default active thread %"),
    Field("pinned_mem_limit", _optional(_mem), "none", "default device pinned memory limit"),
    Field("client_priority", _optional(_priority), "none", "default client priority (0 or 1)"),
    Field("start_timeout", _seconds, "15", "seconds for a daemon to answer after start"),
    Field("command_timeout", _seconds, "10", "seconds for one control command"),
    Field("terminate_timeout", _seconds, "5", "seconds for clients to exit after terminate_client"),
    Field("quit_timeout", _seconds, "5", "seconds for quit before killing by PID"),
    Field("kill_grace", _seconds, "10", "seconds between a forwarded signal and SIGKILL"),
    Field(
        "log_archive",
        _optional(_abs_path),
        "none",
        "copy each daemon's control.log and server.log here before removing its directory",
    ),
    Field("health_check", _bool, "no", "epilog: run a GPU health check after teardown"),
    Field("syslog", _bool, "yes", "hooks: log to syslog as well as stderr"),
    Field("log_level", _choice("debug", "info", "warning", "error"), "info", "log level"),
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


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        cause = exc.strerror or str(exc)
        raise ConfigError("cannot read config file", thing=str(path), cause=cause) from exc
    except UnicodeDecodeError as exc:
        cause = "not UTF-8 text"
        raise ConfigError("cannot read config file", thing=str(path), cause=cause) from exc


def read_config_file(path: Path, problems: list[ConfigError] | None = None) -> dict[str, str]:
    """Parse an admin file into raw strings; errors name the file and line (a bad line is
    noted in ``problems`` and skipped, when given)."""
    values: dict[str, str] = {}
    for number, raw in enumerate(_read_text(path).splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line == "[mpswrap]":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            error = ConfigError("expected key = value", thing=f"{path}:{number}", cause=repr(raw))
            _problem(error, problems)
            continue
        values[key.strip()] = value.strip()
    return values


@dataclass(frozen=True)
class Settings:
    """Resolved settings: one typed attribute per entry of ``FIELDS``, in the same order.

    Names, parsers, defaults and docs are written only in ``FIELDS``; this class adds just
    the static types, and a unit test keeps its attributes and ``FIELDS`` in step.
    """

    run_dir: str
    user_run_dir: str | None
    control_binary: str
    gpu_inventory: str
    client_limit: int | Literal["auto"]
    gpu_policy: str
    prolog_mode: Literal["always", "opt-in", "never"]
    opt_in: tuple[str, ...]
    prolog_failure: Literal["drain", "continue"]
    epilog_failure: Literal["drain", "continue"]
    cpu_binding: bool
    prestart_server: bool
    active_thread_percentage: float | None
    pinned_mem_limit: str | None
    client_priority: int | None
    start_timeout: float
    command_timeout: float
    terminate_timeout: float
    quit_timeout: float
    kill_grace: float
    log_archive: str | None
    health_check: bool
    syslog: bool
    log_level: str
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
    typed = cast("dict[str, Any]", dict(values))
    return Settings(**typed, sources=dict(sources))


def _show(value: object) -> str:
    if isinstance(value, tuple):
        return ", ".join(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "none" if value is None else str(value)


def _file_layer(
    env: Mapping[str, str], config_file: str | None, problems: list[ConfigError] | None
) -> Iterator[tuple[str, str, str]]:
    """(name, text, where) for each line of the admin file, when there is one to read."""
    path = config_file or env.get("MPSWRAP_CONFIG") or DEFAULT_CONFIG_FILE
    explicit = bool(config_file or env.get("MPSWRAP_CONFIG"))
    # Only a file someone named must exist; the default location is optional.
    if not explicit and not os.path.exists(path):
        return
    try:
        lines = read_config_file(Path(path), problems)
    except ConfigError as exc:
        _problem(exc, problems)
        return
    for name, text in lines.items():
        yield name, text, path


def _env_layer(env: Mapping[str, str]) -> Iterator[tuple[str, str, str]]:
    """(name, text, variable) for each ``MPSWRAP_*`` variable that is a setting."""
    for var, text in env.items():
        if var.startswith(ENV_PREFIX) and var not in _NOT_SETTINGS:
            name = var[len(ENV_PREFIX) :].lower()
            if name.startswith("sim_"):
                continue  # the simulator's own variables
            yield name, text, var


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
