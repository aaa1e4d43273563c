from __future__ import annotations

import typing
from pathlib import Path

import pytest

from mpswrap._struct import fields
from mpswrap.config import FIELDS, Field, Settings, load_settings
from mpswrap.errors import ConfigError


def test_defaults_and_sources() -> None:
    s = load_settings(env={}, config_file=None)
    assert s.run_dir == "/run/mpswrap"
    assert s.sources["run_dir"] == "default"
    assert s.opt_in == ("gres-mps", "spank", "feature:mps", "comment:mps")


def test_precedence_argument_env_file_default(tmp_path: Path) -> None:
    conf = tmp_path / "mpswrap.conf"
    conf.write_text("# admin file\nstart_timeout = 7\nquit_timeout = 3\ncommand_timeout=4\n")
    env = {"MPSWRAP_CONFIG": str(conf), "MPSWRAP_QUIT_TIMEOUT": "2"}
    s = load_settings({"command_timeout": "1"}, env=env)
    assert (s.start_timeout, s.quit_timeout, s.command_timeout) == (7.0, 2.0, 1.0)
    assert s.sources["start_timeout"] == f"file {conf}"
    assert s.sources["quit_timeout"] == "env MPSWRAP_QUIT_TIMEOUT"
    assert s.sources["command_timeout"] == "argument"
    assert s.sources["kill_grace"] == "default"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no_such_key = 1", "unknown setting"),
        ("prolog_mode = sometimes", "expected one of always, opt-in, never"),
        ("start_timeout = -1", "expected seconds"),
        ("run_dir = relative/dir", "expected an absolute path"),
        ("client_limit = 0", "expected auto or a number"),
        ("pinned_mem_limit = 12T", "expected a size like 512M or 2G"),
        ("opt_in = gres-mps, colour:red", "expected a list of gres-mps"),
        ("active_thread_percentage = 150", "percentage in (0, 100]"),
        ("this line has no equals", "expected key = value"),
    ],
)
def test_bad_file_values_name_the_choice(tmp_path: Path, text: str, message: str) -> None:
    conf = tmp_path / "c.conf"
    conf.write_text(text + "\n")
    with pytest.raises(ConfigError) as err:
        load_settings(env={}, config_file=str(conf))
    assert message in str(err.value)
    assert str(conf) in str(err.value)


def test_unknown_env_variable_is_named_in_a_warning_and_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stray ``MPSWRAP_*`` variable must not stop every command (``stop`` included)."""
    with caplog.at_level("WARNING", logger="mpswrap.config"):
        settings = load_settings(env={"MPSWRAP_QUIT_TIMEOT": "1", "MPSWRAP_QUIT_TIMEOUT": "3"})
    assert settings.quit_timeout == 3.0
    assert caplog.messages == [
        "ignoring MPSWRAP_QUIT_TIMEOT: not a setting (did you mean MPSWRAP_QUIT_TIMEOUT?)"
    ]


def test_missing_explicit_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(env={"MPSWRAP_CONFIG": str(tmp_path / "absent.conf")})


def test_a_hash_inside_a_value_is_part_of_it_one_after_a_blank_starts_a_comment(
    tmp_path: Path,
) -> None:
    conf = tmp_path / "site.conf"
    conf.write_text(
        "# a comment\n  # an indented one\nuser_run_dir = /tmp/a#b\n"
        "run_dir = /run/x # the admin's note\nkill_grace = 20\t# seconds\n"
    )
    settings = load_settings(env={"MPSWRAP_CONFIG": str(conf)})
    assert settings.user_run_dir == "/tmp/a#b"
    assert settings.run_dir == "/run/x"
    assert settings.kill_grace == 20.0


def test_describe_lists_every_setting() -> None:
    rows = load_settings(env={}).describe()
    names = [r[0] for r in rows]
    assert "run_dir" in names and "prolog_failure" in names
    assert all(source == "default" for _, _, source in rows)


def test_settings_attributes_and_fields_table_name_the_same_settings_in_order() -> None:
    # FIELDS is the one place a setting is written; Settings only types it. If either list
    # gains, loses or reorders a name without the other, this is where it shows.
    attributes = [name for name in fields(Settings) if name != "sources"]
    assert attributes == [f.name for f in FIELDS]
    assert fields(Settings)[-1] == "sources"


#: A text for each setting whose default parses to None or "auto", to check the other branch.
_OTHER_BRANCH = {
    "user_run_dir": "/run/user/1000/mpswrap",
    "client_limit": "8",
    "active_thread_percentage": "50",
    "pinned_mem_limit": "2g",
    "client_priority": "1",
    "log_archive": "/var/log/mpswrap",
}


def _conforms(value: object, hint: object) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return value in args
    if args and origin is not tuple:  # typing.Union or X | Y
        return any(_conforms(value, arg) for arg in args)
    if origin is tuple:  # only tuple[str, ...] is used
        return isinstance(value, tuple) and all(_conforms(v, args[0]) for v in value)
    if hint is type(None):
        return value is None
    if hint in (int, float):  # bool is an int to isinstance, but never a count or seconds
        return type(value) is hint
    return isinstance(value, typing.cast(type, hint))


@pytest.mark.parametrize("spec", FIELDS, ids=lambda f: f.name)
def test_each_parser_returns_its_attributes_declared_type(spec: Field) -> None:
    # mypy cannot link a parser in FIELDS to its Settings attribute, so check it here.
    # config imports typing's names for mypy only: they are given here.
    hint = typing.get_type_hints(Settings, localns=vars(typing))[spec.name]
    texts = [spec.default] + ([_OTHER_BRANCH[spec.name]] if spec.name in _OTHER_BRANCH else [])
    for text in texts:
        value = spec.parse(text)
        assert _conforms(value, hint), (spec.name, text, value, hint)
    if spec.name in _OTHER_BRANCH:
        assert spec.parse(spec.default) in (None, "auto")


def test_attributes_are_typed_values_and_unknown_names_fail() -> None:
    s = load_settings(env={"MPSWRAP_CLIENT_LIMIT": "8", "MPSWRAP_CPU_BINDING": "no"})
    assert s.client_limit == 8
    assert s.cpu_binding is False
    assert s.values["client_limit"] == 8
    with pytest.raises(AttributeError):
        getattr(s, "no_such_setting")  # noqa: B009 - the name must not resolve


def test_replace_parses_strings_skips_none_and_marks_the_source() -> None:
    base = load_settings(env={"MPSWRAP_QUIT_TIMEOUT": "2"})
    s = base.replace(start_timeout="3", prestart_server=True, quit_timeout=None)
    assert (s.start_timeout, s.prestart_server, s.quit_timeout) == (3.0, True, 2.0)
    assert s.sources["start_timeout"] == "argument"
    assert s.sources["prestart_server"] == "argument"
    assert s.sources["quit_timeout"] == "env MPSWRAP_QUIT_TIMEOUT"
    assert base.start_timeout == 15.0  # the original is untouched
    with pytest.raises(ConfigError, match="bad value for start_timeout") as err:
        base.replace(start_timeout="never")
    assert "in argument" in str(err.value)


@pytest.mark.parametrize("value", ["1", 1])
def test_replace_rejects_unknown_settings_parsed_or_not(value: object) -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings(env={}).replace(no_such=value)


def test_describe_shows_values_as_an_admin_would_write_them() -> None:
    s = load_settings({"pinned_mem_limit": "2g", "health_check": True}, env={})
    rows = {name: (value, source) for name, value, source in s.describe()}
    assert list(rows) == [f.name for f in FIELDS]
    assert rows["opt_in"] == ("gres-mps, spank, feature:mps, comment:mps", "default")
    assert rows["pinned_mem_limit"] == ("2G", "argument")
    assert rows["health_check"] == ("yes", "argument")
    assert rows["syslog"] == ("yes", "default")
    assert rows["log_archive"] == ("none", "default")
    assert rows["start_timeout"] == ("15.0", "default")
    assert rows["client_limit"] == ("auto", "default")


def test_the_grace_option_and_the_kill_grace_setting_take_the_same_seconds() -> None:
    """``--grace`` and ``kill_grace`` are one quantity: 0 (at once) to an hour, both; and a
    wait's range is said as the values it takes ("above 0 and at most 3600")."""
    from mpswrap.cli.options import WRAPPER_OPTIONS

    option = next(kw["type"] for flags, kw in WRAPPER_OPTIONS if flags == ("--grace",))
    for text in ("0", "2.5", "3600"):
        assert option(text) == load_settings(env={}, overrides={"kill_grace": text}).kill_grace
    for text in ("3601", "-1", "5_0"):
        with pytest.raises(ConfigError, match="expected seconds from 0 to 3600"):
            load_settings(env={"MPSWRAP_KILL_GRACE": text})
    with pytest.raises(ConfigError, match="expected seconds above 0 and at most 3600"):
        load_settings(env={"MPSWRAP_START_TIMEOUT": "0"})
