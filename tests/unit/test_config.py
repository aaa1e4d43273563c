from __future__ import annotations

from pathlib import Path

import pytest

from mpswrap.config import load_settings
from mpswrap.errors import ConfigError


def test_defaults_and_sources() -> None:
    s = load_settings(env={}, config_file=None)
    assert s.run_dir == "/run/mpswrap"
    assert s.sources["run_dir"] == "default"
    assert s.opt_in == ("gres-mps", "feature:mps", "comment:mps")


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


def test_unknown_env_setting_is_an_error() -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings(env={"MPSWRAP_NO_SUCH": "1"})


def test_missing_explicit_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(env={"MPSWRAP_CONFIG": str(tmp_path / "absent.conf")})


def test_describe_lists_every_setting() -> None:
    rows = load_settings(env={}).describe()
    names = [r[0] for r in rows]
    assert "run_dir" in names and "prolog_failure" in names
    assert all(source == "default" for _, _, source in rows)
