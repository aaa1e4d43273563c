"""Property tests of every parser: generated input round-trips, garbage fails only cleanly.

"Cleanly" means the documented error class (ConfigError, GpuError, LayoutError, UsageError),
never a ValueError, IndexError or ZeroDivisionError traceback in front of a user or admin.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mpswrap import config, jobenv, paths
from mpswrap.errors import ConfigError, GpuError, LayoutError, MpswrapError, UsageError
from mpswrap.job import placement as client
from mpswrap.mps import gpu, mpslog
from mpswrap.slurm import gpus as slurm_gpus

T = TypeVar("T")

# No example database: the tests must not write a .hypothesis/ directory into the tree.
PROPS = settings(
    deadline=None,
    max_examples=150,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
NAMES = sorted(f.name for f in config.FIELDS)


def _outcome(fn: Callable[..., T], *args: Any) -> tuple[T | None, MpswrapError | None]:
    """(result, None), or (None, the error) for an error of mpswrap's own tree only: any
    other exception propagates and fails the property."""
    try:
        return fn(*args), None
    except MpswrapError as exc:
        return None, exc


@contextmanager
def _file(data: bytes) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="mpsw-prop-") as tmp:
        path = Path(tmp) / "data"
        path.write_bytes(data)
        yield path


# --- jobenv.parse_int_list ----------------------------------------------------------------
_ranges = st.lists(
    st.tuples(st.integers(0, 100_000), st.integers(0, 64)).map(lambda t: (t[0], t[0] + t[1])),
    min_size=1,
    max_size=8,
)


def _spell(lo: int, hi: int, pad: str) -> str:
    return f"{pad}{lo}{pad}" if lo == hi else f"{pad}{lo}-{hi}{pad}"


@PROPS
@given(_ranges, st.sampled_from(["", " "]))
def test_int_list_round_trips_generated_lists_and_ranges(
    ranges: list[tuple[int, int]], pad: str
) -> None:
    text = ",".join(_spell(lo, hi, pad) for lo, hi in ranges)
    expected = tuple(n for lo, hi in ranges for n in range(lo, hi + 1))
    assert jobenv.parse_int_list(text) == expected


@PROPS
@given(st.text(max_size=40))
def test_int_list_garbage_raises_only_config_error(text: str) -> None:
    out, error = _outcome(jobenv.parse_int_list, text, "GPU list")
    if error is not None:
        assert isinstance(error, ConfigError) and error.line().startswith("malformed GPU list")
    else:
        assert out is not None and all(isinstance(n, int) and n >= 0 for n in out)


@PROPS
@given(st.integers(0, 1000), st.integers(1, 1000))
def test_int_list_refuses_reversed_ranges(lo: int, gap: int) -> None:
    with pytest.raises(ConfigError, match="bad range"):
        jobenv.parse_int_list(f"{lo + gap}-{lo}")


# --- config: admin files through load_settings ---------------------------------------------
#: A valid spelling of every setting and the value it must resolve to.
_VALID: dict[str, st.SearchStrategy[tuple[str, object]]] = {
    "run_dir": st.sampled_from(["/run/mpswrap", "/tmp/x//y/", "/a/./b"]).map(
        lambda p: (p, os.path.normpath(p))
    ),
    "user_run_dir": st.sampled_from([("none", None), ("off", None), ("/tmp/u", "/tmp/u")]),
    "control_binary": st.sampled_from(["nvidia-cuda-mps-control", "/opt/bin/mps"]).map(
        lambda t: (t, t)
    ),
    "gpu_inventory": st.sampled_from([("nvml", "nvml"), ("/tmp/g.json", "/tmp/g.json")]),
    "inventory_cache": st.sampled_from([("no", False), ("yes", True)]),
    "client_limit": st.one_of(
        st.just(("auto", "auto")), st.integers(1, 128).map(lambda n: (str(n), n))
    ),
    "gpu_policy": st.sampled_from(["block", "cyclic", "affinity"]).map(lambda t: (t, t)),
    "prolog_mode": st.sampled_from(["always", "opt-in", "never"]).map(lambda t: (t, t)),
    "opt_in": st.sampled_from(
        [("gres-mps", ("gres-mps",)), ("feature:a, comment:b", ("feature:a", "comment:b"))]
    ),
    "prolog_failure": st.sampled_from(["drain", "continue"]).map(lambda t: (t, t)),
    "epilog_failure": st.sampled_from(["drain", "continue"]).map(lambda t: (t, t)),
    "cpu_binding": st.sampled_from([("yes", True), ("OFF", False), ("1", True)]),
    "exclusive_process": st.sampled_from([("no", False), ("YES", True), ("0", False)]),
    "prestart_server": st.sampled_from([("true", True), ("no", False)]),
    "active_thread_percentage": st.one_of(
        st.just(("none", None)), st.integers(1, 100).map(lambda n: (str(n), float(n)))
    ),
    "pinned_mem_limit": st.tuples(st.integers(1, 4096), st.sampled_from("MGmg")).map(
        lambda t: (f"{t[0]}{t[1]}", f"{t[0]}{t[1].upper()}")
    ),
    "client_priority": st.sampled_from([("0", 0), ("1", 1), ("none", None)]),
    "start_timeout": st.integers(1, 3600).map(lambda n: (str(n), float(n))),
    "command_timeout": st.integers(1, 3600).map(lambda n: (str(n), float(n))),
    "terminate_timeout": st.integers(1, 3600).map(lambda n: (str(n), float(n))),
    "terminate_window": st.integers(1, 3600).map(lambda n: (str(n), float(n))),
    "quit_timeout": st.integers(1, 3600).map(lambda n: (str(n), float(n))),
    "teardown_deadline": st.integers(1, 3600).map(lambda n: (str(n), float(n))),
    "cgroup_root": st.sampled_from(
        [("auto", "auto"), ("none", "none"), ("/sys/fs/cgroup/hpc//", "/sys/fs/cgroup/hpc")]
    ),
    "kill_grace": st.integers(1, 3600).map(lambda n: (str(n), float(n))),
    "log_archive": st.sampled_from([("none", None), ("/var/log/mps//", "/var/log/mps")]),
    "log_archive_days": st.one_of(
        st.just(("none", None)), st.integers(1, 36500).map(lambda n: (str(n), float(n)))
    ),
    "health_check": st.sampled_from([("no", False), ("on", True)]),
    "syslog": st.sampled_from([("no", False), ("yes", True)]),
    "verify_attach": st.sampled_from(["warn", "fail", "off"]).map(lambda t: (t, t)),
    "log_level": st.sampled_from(["debug", "info", "warning", "error"]).map(lambda t: (t, t)),
    "farm_profile": st.sampled_from(["auto", "off", "/tmp/p.json"]).map(lambda t: (t, t)),
}


def test_every_setting_has_a_generator() -> None:
    assert sorted(_VALID) == NAMES


@st.composite
def _valid_file(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=8))
    lines, expected = ["[mpswrap]", "# admin file"], {}
    for name in names:
        text, value = draw(_VALID[name])
        space = draw(st.sampled_from(["", " ", "\t"]))
        blank = draw(st.sampled_from([" ", "\t", "  "]))  # an inline comment follows a blank
        lines.append(f"{space}{name}{space}={space}{text}{blank}# comment")
        expected[name] = value
    return "\n".join(lines) + "\n", expected


@PROPS
@given(_valid_file())
def test_settings_round_trip_generated_admin_files(case: tuple[str, dict[str, object]]) -> None:
    text, expected = case
    with _file(text.encode()) as path:
        resolved = config.load_settings(env={}, config_file=str(path))
        for name, value in expected.items():
            assert resolved.values[name] == value, name
            assert resolved.sources[name] == f"file {path}"


#: Printable text on one line (str.splitlines also splits on \x1c-\x1e, \u2028, ...).
_LINE = st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters="#")
_KEY = st.text(
    st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters="=#"),
    min_size=1,
    max_size=20,
)


@PROPS
@given(_KEY, st.text(_LINE, max_size=20))
def test_unknown_keys_name_every_valid_setting(key: str, value: str) -> None:
    assume(key.strip() and key.strip() not in NAMES)
    with _file(f"{key} = {value}\n".encode()) as path:
        _, error = _outcome(config.load_settings, None, {}, str(path))
    assert isinstance(error, ConfigError), error
    assert error.what == "unknown setting"
    assert error.thing == f"{key.strip()} in {path}"
    assert error.hint == f"valid settings: {', '.join(NAMES)}"
    assert error.exit_code == 2


@PROPS
@given(st.sampled_from(NAMES), st.text(max_size=30))
def test_any_value_of_a_known_setting_is_accepted_or_a_config_error(name: str, value: str) -> None:
    _, error = _outcome(config.load_settings, None, {f"MPSWRAP_{name.upper()}": value}, None)
    if error is not None:
        assert isinstance(error, ConfigError) and error.line().startswith(f"bad value for {name} ")


@PROPS
@given(
    st.one_of(
        st.binary(max_size=200),
        st.lists(
            st.tuples(
                st.sampled_from([*NAMES, "colour", "", "[mpswrap]"]), st.text(max_size=20)
            ).map(lambda kv: f"{kv[0]} = {kv[1]}"),
            max_size=6,
        ).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass")),
    )
)
def test_arbitrary_admin_files_give_settings_or_a_config_error(data: bytes) -> None:
    # An admin file is written by hand: a stray Latin-1 byte or a half-edited line must give
    # the one-line ConfigError naming the file, never a traceback from inside the parser.
    with _file(data) as path:
        _, error = _outcome(config.load_settings, None, {}, str(path))
    if error is not None:
        assert isinstance(error, ConfigError), error
        assert str(path) in (error.thing or "") + (error.cause or ""), error.line()


def test_a_non_utf8_admin_file_is_a_config_error() -> None:
    with _file(b"run_dir = /run/mpsw\xe4p\n") as path, pytest.raises(ConfigError, match="config"):
        config.load_settings(env={}, config_file=str(path))


# --- slurm_gpus.expand_hostlist -----------------------------------------------------------------
_word = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6)


@st.composite
def _hostlist(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A Slurm hostlist like ``gpu[01-03,7]-ib,login`` and the names it stands for."""
    parts, names = [], []
    for _ in range(draw(st.integers(1, 4))):
        head = draw(_word)
        if not draw(st.booleans()):
            parts.append(head)
            names.append(head)
            continue
        tail = draw(st.sampled_from(["", "-ib", "x"]))
        width = draw(st.integers(1, 3))
        items = []
        for _ in range(draw(st.integers(1, 3))):
            lo = draw(st.integers(0, 10**width - 1))
            hi = draw(st.integers(lo, min(lo + 5, 10**width - 1)))
            items.append(f"{lo:0{width}d}" + (f"-{hi:0{width}d}" if hi != lo else ""))
            names += [f"{head}{n:0{width}d}{tail}" for n in range(lo, hi + 1)]
        parts.append(f"{head}[{','.join(items)}]{tail}")
    return ",".join(parts), names


@PROPS
@given(_hostlist())
def test_hostlist_expansion_of_generated_lists(case: tuple[str, list[str]]) -> None:
    text, names = case
    assert slurm_gpus.expand_hostlist(text) == names


@PROPS
@given(st.text("ab[]-,0123456789x", max_size=25))
def test_hostlist_garbage_raises_only_gpu_error(text: str) -> None:
    # gres.conf is read by the prolog and by every rank (gres positions); a malformed
    # NodeName=/File= must be a one-line GpuError, not a ValueError traceback.
    out, error = _outcome(slurm_gpus.expand_hostlist, text)
    if error is not None:
        assert isinstance(error, GpuError), error
    else:
        assert out is not None and all(isinstance(n, str) for n in out)


# --- gpu.check_uuid -----------------------------------------------------------------------
_hex = "0123456789abcdefABCDEF"
_uuid = st.tuples(
    st.sampled_from(["GPU", "MIG"]),
    *(st.text(_hex, min_size=n, max_size=n) for n in (8, 4, 4, 4, 12)),
).map(lambda t: f"{t[0]}-" + "-".join(t[1:]))
_UUID_FULL = re.compile(r"(GPU|MIG)-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")


@PROPS
@given(_uuid)
def test_check_uuid_accepts_every_well_formed_uuid(uuid: str) -> None:
    assert gpu.check_uuid(uuid) == uuid


@PROPS
@given(
    st.one_of(
        st.text(max_size=60),
        _uuid.flatmap(lambda u: st.sampled_from([u + "\n", " " + u, u + "0", u[:-1], u + "/1"])),
    )
)
def test_check_uuid_accepts_nothing_else(text: str) -> None:
    accepted, error = _outcome(gpu.check_uuid, text)
    if error is not None:
        assert isinstance(error, GpuError) and error.line().startswith("malformed GPU UUID")
    else:
        assert accepted is not None and _UUID_FULL.fullmatch(accepted), repr(accepted)


# --- paths.validate_name --------------------------------------------------------------------
_SAFE = "abcXYZ019._-"


@PROPS
@given(st.text(_SAFE[:6], min_size=1, max_size=1), st.text(_SAFE, max_size=63))
def test_validate_name_accepts_safe_components(first: str, rest: str) -> None:
    assume(".." not in first + rest)
    assert paths.validate_name("job id", first + rest) == first + rest


@PROPS
@given(
    st.one_of(
        st.text(max_size=80),
        st.text(_SAFE, min_size=65, max_size=80),
        st.text(_SAFE, max_size=30).map(lambda s: s + "\n"),
        st.text(_SAFE, max_size=30).flatmap(
            lambda s: st.sampled_from([s + "/x", s + "..", ".." + s, "/" + s])
        ),
    )
)
def test_validate_name_never_accepts_an_unsafe_component(text: str) -> None:
    name, error = _outcome(paths.validate_name, "job id", text)
    if error is not None:
        assert isinstance(error, LayoutError) and error.line().startswith("invalid job id")
        return
    assert name is not None
    # Whatever is accepted is one plain path component, 1 to 64 characters.
    assert 1 <= len(name) <= 64, repr(name)
    assert "/" not in name and ".." not in name and "\x00" not in name, repr(name)
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name), repr(name)
    assert os.path.basename(name) == name and os.path.normpath(name) == name


# --- mpslog.read_faults -----------------------------------------------------------------------
_pid = st.integers(1, 4_194_304).map(str)
_log_line = st.one_of(
    st.text(max_size=60),
    _pid.map(lambda p: f"Client {{PID: {p}, Context: 1}} encountered a fatal GPU error."),
    st.just("Server is handling a fatal GPU error."),
    st.just("The following client process have a sticky error set:"),
    _pid,
    st.just("Destroy server context on device 0"),
    _pid.map(lambda p: f"Status of client {{PID: {p}, Context ID: 1}} is ACTIVE"),
    st.just("Client termination succeeded."),
    _pid.map(lambda p: f"Starting new server {p} for user 1000"),
)
_stamped = st.tuples(_pid, _log_line, st.booleans()).map(
    lambda t: f"[2026-11-22 06:53:48.123 Server {t[0]}] {t[1]}" if t[2] else t[1]
)
_FATAL = re.compile(r"Client \{PID: (\d+), Context(?: ID)?: \d+\} encountered a fatal")
_NEW_SERVER = re.compile(r"Starting new server (\d+)")


@PROPS
@given(
    st.one_of(
        st.binary(max_size=300),
        st.lists(_stamped, max_size=30).map(lambda ls: "\n".join(ls).encode()),
        st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    )
)
def test_mpslog_reports_what_the_log_says_and_never_raises(data: bytes) -> None:
    with _file(data) as path:
        faults = mpslog.read_faults(path)
        count = mpslog.terminations(path)
        servers = mpslog.server_pids(path)
        lines = path.read_text(errors="replace").split("\n")  # as the parser reads the file
    numbers = {int(n) for n in re.findall(r"\d+", "\n".join(lines))}
    assert count == sum("Client termination succeeded" in line for line in lines)
    assert servers == {int(m[1]) for line in lines if (m := _NEW_SERVER.search(line))}
    reporters = [int(m[1]) for line in lines if (m := _FATAL.search(line))]
    assert [pid for fault in faults for pid in fault.reported_by] == reporters, faults
    for fault in faults:
        assert fault.reported_by, fault
        assert set(fault.affected) <= numbers, fault  # every PID is a number of the log
        assert fault.server_pid in numbers | {0}, fault  # 0: no header line before it
    # A fault ends only by recovery: the next fatal error before that belongs to it.
    assert all(fault.recovered for fault in faults[:-1]), faults


def test_read_faults_of_a_missing_log_is_empty() -> None:
    assert mpslog.read_faults(Path("/nonexistent/server.log")) == []


# --- client.provision_threads -----------------------------------------------------------------
_spec = st.one_of(
    st.none(),
    st.sampled_from(["none", "uniform", "oversubscribe", "", "lots", "nan", "inf", "-5", "1e3"]),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.lists(st.floats(min_value=-1, max_value=1e6, allow_nan=False), min_size=1, max_size=5).map(
        lambda ws: ":".join(f"{w:g}" for w in ws)
    ),
    st.text(max_size=12),
)


@PROPS
@given(_spec, st.integers(1, 128).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))))
def test_provision_threads_is_none_or_a_percentage(spec: str | None, at: tuple[int, int]) -> None:
    n, index = at
    try:
        value = client.provision_threads(spec, n, index)
    except UsageError:
        return
    assert value is None or 1.0 <= value <= 100.0, (spec, n, index, value)


@PROPS
@given(st.integers(1, 100))
def test_uniform_shares_of_one_gpu_add_up_to_at_most_100(n: int) -> None:
    shares = [client.provision_threads("uniform", n, i) for i in range(n)]
    assert all(s is not None for s in shares)
    assert sum(s for s in shares if s is not None) <= 100.0 + 1e-9, (n, shares[0])


# --- client.choose_gpu --------------------------------------------------------------------------
_cpus = st.frozensets(st.integers(0, 15), max_size=6)


@PROPS
@given(
    st.integers(0, 256).flatmap(
        lambda size: st.tuples(st.just(size), st.integers(0, max(size, 1) - 1))
    ),
    st.integers(1, 16),
    st.sampled_from(client.POLICIES),
    st.one_of(st.none(), _cpus),
    st.data(),
)
def test_choose_gpu_is_always_in_range(
    rank_size: tuple[int, int],
    n_gpus: int,
    policy: str,
    rank_cpus: frozenset[int] | None,
    data: st.DataObject,
) -> None:
    size, rank = rank_size
    gpu_cpus = data.draw(st.one_of(st.none(), st.lists(_cpus, min_size=n_gpus, max_size=n_gpus)))
    position = client.choose_gpu(
        rank, size, n_gpus, policy=policy, rank_cpus=rank_cpus, gpu_cpus=gpu_cpus
    )
    assert 0 <= position < n_gpus


@PROPS
@given(st.integers(1, 256), st.integers(1, 16))
def test_block_keeps_rank_order_and_balances_gpus(size: int, n_gpus: int) -> None:
    plan = client.plan_positions(size, n_gpus, "block")
    assert plan == sorted(plan)  # consecutive ranks share a GPU, in rank order
    counts = Counter(plan)
    used = [counts.get(g, 0) for g in range(n_gpus)]
    # No GPU sits idle (or nearly) while another carries two more ranks than it.
    assert max(used) - min(used) <= 1, (size, n_gpus, used)
    assert max(used) == math.ceil(size / n_gpus)


@PROPS
@given(st.integers(1, 256), st.integers(1, 16))
def test_cyclic_is_round_robin(size: int, n_gpus: int) -> None:
    assert client.plan_positions(size, n_gpus, "cyclic") == [r % n_gpus for r in range(size)]


@pytest.mark.parametrize(
    ("name", "text", "named"),
    [
        ("n1", "n1", True),
        ("n07", "n[01-10]", True),
        ("n7", "n[01-10]", False),  # not the padded name Slurm gives
        ("gpu3-ib", "login,gpu[1-4]-ib", True),
        ("gpu5-ib", "login,gpu[1-4]-ib", False),
        ("zz5", "n1,zz[0-65000]", True),
    ],
)
def test_a_name_is_found_in_a_hostlist_as_expanding_it_would(
    name: str, text: str, named: bool
) -> None:
    assert slurm_gpus.in_hostlist(name, text) is named
    assert (name in slurm_gpus.expand_hostlist(text)) is named


@pytest.mark.parametrize("text", ["zz[0-999999999999]", "a[0-40000],b[0-40000]", "n[1-x]"])
def test_a_hostlist_past_what_slurm_allows_is_refused_unexpanded(text: str) -> None:
    with pytest.raises(GpuError):
        slurm_gpus.expand_hostlist(text)
    if "x" in text or text.startswith("zz"):
        with pytest.raises(GpuError):
            slurm_gpus.in_hostlist("q1", text)
