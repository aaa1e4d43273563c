"""The one command-line grammar: every first word has one meaning, decided before anything
touches NVML or a daemon; every exit code mpswrap documents is produced here; no argv gives a
traceback."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mpswrap.cli import main as cli
from mpswrap.cli import options
from mpswrap.cli.commands import COMMANDS
from mpswrap.errors import EXIT_CODES
from tests.simenv import MPSWRAP, SimNode

pytestmark = pytest.mark.functional

JOB = ("--job", "j1", "--node", "n1")
ARABIC_ONE = "\u0661"  # a digit to Python's int() and float(), not to mpswrap


class _NoNvml(types.ModuleType):
    """Stands in for pynvml: any use of it fails the test."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"pynvml.{name} used")


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["stauts"], "status"),
        (["--gpus", "0", "stpo"], "stop"),
        (["mpirn", "-np", "2", "./app"], "mpirun"),
        (["hepl"], "help"),
        (["statu"], "status"),
        (["xyzzy-no-such-word"], None),
        (["logs"], None),
        (["sta"], None),
    ],
)
def test_an_unknown_word_is_a_usage_error_before_any_gpu_work(
    argv: list[str],
    suggestion: str | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _NoNvml("pynvml"))
    monkeypatch.setenv("MPSWRAP_GPU_INVENTORY", "nvml")
    monkeypatch.setenv("MPSWRAP_USER_RUN_DIR", str(tmp_path / "run"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    word = argv[-1] if argv[0] == "--gpus" else argv[0]
    word = argv[2] if argv[0] == "--gpus" else word
    expected = f"mpswrap: unknown command '{word}'"
    expected += f" (did you mean '{suggestion}'?)" if suggestion else ""
    assert err[0] == expected
    assert err[1].startswith("hint: mpswrap help ") and f"mpswrap -- {word}" in err[1]
    assert not (tmp_path / "run").exists()  # nothing created


def test_after_dashdash_a_word_is_always_a_program(node: SimNode) -> None:
    res = node.mpswrap("--", "status")  # a program named like a command: not on PATH
    assert res.returncode == 127, res
    assert res.stderr.splitlines()[0] == "mpswrap: program not found (status)"
    res = node.mpswrap("--", "true")
    assert res.returncode == 0, res


def test_help_lists_every_mode_and_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    for word in [*(c.name for c in COMMANDS), *options.LAUNCHERS]:
        assert re.search(rf"\b{re.escape(word)}\b", text), word
    for mode in ("[--] PROGRAM", "run -n N", "srun mpswrap ./app"):
        assert mode in text, mode
    for flags, _ in (*options.WRAPPER_OPTIONS, *options.VERBOSITY):
        assert all(flag in text for flag in flags), flags
    assert cli.main(["help"]) == 0
    assert capsys.readouterr().out == text
    assert cli.main(["help", "run"]) == 0
    assert capsys.readouterr().out.startswith("usage: mpswrap run -n N [options] -- PROGRAM")


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbosity_options_go_before_or_after_the_command(node: SimNode, where: str) -> None:
    for flag, debug, info in (("-v", True, True), ("--debug", True, True), ("-q", False, False)):
        cmd = ["run", "-n", "1", "--", "true"]
        argv = [flag, *cmd] if where == "before" else [*cmd[:3], flag, *cmd[3:]]
        res = node.mpswrap(*argv)
        assert res.returncode == 0, res
        assert ("'get_server_list' -> " in res.stderr) == debug, (flag, res.stderr)
        assert ("started MPS daemon" in res.stderr) == info, (flag, res.stderr)
        argv = [flag, "status", *JOB] if where == "before" else ["status", *JOB, flag]
        assert node.mpswrap(*argv).returncode == 4


def test_log_level_setting_is_honoured_by_every_mode(node: SimNode) -> None:
    """``MPSWRAP_LOG_LEVEL``: warning silences run's info lines, debug shows a rank's."""
    res = node.mpswrap("run", "-n", "1", "--", "true")
    assert res.returncode == 0, res
    assert "started MPS daemon" in res.stderr
    res = node.mpswrap("run", "-n", "1", "--", "true", MPSWRAP_LOG_LEVEL="warning")
    assert res.returncode == 0, res
    assert "started MPS daemon" not in res.stderr, res.stderr
    res = node.mpswrap("--job", "j2", "true")  # per-rank mode: quiet by default
    assert res.returncode == 0, res
    assert "started MPS daemon" not in res.stderr, res.stderr
    res = node.mpswrap("--job", "j3", "true", MPSWRAP_LOG_LEVEL="info")
    assert res.returncode == 0, res
    assert "started MPS daemon" in res.stderr, res.stderr
    res = node.mpswrap("-q", "run", "-n", "1", "--", "true", MPSWRAP_LOG_LEVEL="debug")
    assert "started MPS daemon" not in res.stderr, res.stderr  # the flag outranks the setting


def test_an_unknown_mpswrap_variable_is_a_warning_not_a_failure(node: SimNode) -> None:
    res = node.mpswrap("stop", *JOB, MPSWRAP_CLIENT_LIMT="4")
    assert res.returncode == 0, res
    assert res.stderr.splitlines() == [
        "mpswrap: ignoring MPSWRAP_CLIENT_LIMT: not a setting (did you mean MPSWRAP_CLIENT_LIMIT?)"
    ]


# --- every documented exit code, produced -------------------------------------------------
def _codes(node: SimNode, tmp_path: Path) -> dict[str, int]:
    """Run one case per documented exit code; return what each gave."""
    found: dict[str, int] = {}
    assert node.mpswrap("stauts").returncode == 2
    found["4"] = node.mpswrap("status", *JOB).returncode
    # A program this node lacks fails the operation (1); a path that is no program is a bad
    # value of the setting (2), as a GPU it does not have.
    found["1"] = node.mpswrap("start", *JOB, MPSWRAP_CONTROL_BINARY="no-mps-control").returncode
    path = "/nonexistent/nvidia-cuda-mps-control"
    assert node.mpswrap("start", *JOB, MPSWRAP_CONTROL_BINARY=path).returncode == 2
    found["2"] = node.mpswrap("start", "--gpus", "7", *JOB).returncode  # no such GPU: a bad value
    started = node.mpswrap("start", "--gpus", "0", *JOB)
    assert started.returncode == 0, started
    found["0"] = node.mpswrap("status", *JOB).returncode
    pid = int(re.search(r"daemon (\d+)", started.stdout).group(1))  # type: ignore[union-attr]
    os.kill(pid, signal.SIGKILL)
    found["3"] = node.mpswrap("status", *JOB).returncode  # daemon NOT RUNNING
    assert node.mpswrap("stop", *JOB).returncode in (0, 1)
    plain = tmp_path / "plain.txt"
    plain.write_text("not a program\n")
    found["126"] = node.mpswrap("run", "-n", "1", "--", str(plain)).returncode
    found["127"] = node.mpswrap("run", "-n", "1", "--", "no-such-program-x").returncode
    found["69"] = node.mpswrap(
        "run",
        "-n",
        "1",
        "--verify-attach",
        "fail",
        "--verify-timeout",
        "0.5",
        "--",
        "sleep",
        "20",
    ).returncode
    # Ranks ignore TERM (mpswrap ends them through MPS first), so the program kills itself.
    killed = node.mpswrap("run", "-n", "1", "--", "sh", "-c", "kill -KILL $$").returncode
    found["128+N"] = 128 if killed == 128 + signal.SIGKILL else killed
    return found


def test_every_documented_exit_code_is_produced(node: SimNode, tmp_path: Path) -> None:
    documented = [code for code, _ in EXIT_CODES]
    found = _codes(node, tmp_path)
    assert sorted(found) == sorted(documented)
    expected = {code: 128 if code == "128+N" else int(code) for code in documented}
    assert found == expected


# --- no argv gives a traceback -------------------------------------------------------------
_WORDS = st.sampled_from(
    [
        "status",
        "config",
        "version",
        "help",
        "run",
        "stauts",
        "srun",
        "mpirun",
        "--",
        "true",
        "./nothere",
        "-n",
        "0",
        "2",
        "-1",
        "x",
        "--gpus",
        "all",
        "0,1",
        "GPU-x",
        "--policy",
        "cyclic",
        "--threads",
        "uniform",
        "150",
        "1:2",
        "--mem-limit",
        "8G",
        "auto",
        "--priority",
        "--verify-attach",
        "warn",
        "--verify-timeout",
        "nan",
        "--grace",
        "--job",
        "j/1",
        "--node",
        "--run-dir",
        "/nonexistent",
        "--json",
        "-v",
        "-q",
        "--debug",
        "--config",
        "=",
        "-np",
        "-",
        "--dry-run",
        "--no-shield",
        "",
        "é",
        "--help-me",
        "-vvq",
    ]
)
_OPTION = st.sampled_from(
    [
        ["--gpus", "0"],
        ["--gpus", "9"],
        ["--gpus", "GPU-nope"],
        ["--threads", "150"],
        ["--threads", "1:0"],
        ["--threads", "uniform"],
        ["--mem-limit", "0G"],
        ["--mem-limit", "8G"],
        ["--priority", "2"],
        ["--verify-attach", "maybe"],
        ["--verify-timeout", "-1"],
        ["--grace", "nan"],
        ["--job", "../x"],
        ["--job", "j1"],
        ["--policy", "affinity"],
        ["-v"],
        ["-q"],
        ["--debug"],
        ["--no-shield"],
    ]
)
_MODE = st.sampled_from(
    ["status", "config", "version", "help", "run", "srun", "mpirun", "true", "--", "sh", "stuatus"]
)
#: Shaped like real use: options, a mode word, then arguments.
_SHAPED = st.tuples(st.lists(_OPTION, max_size=3), _MODE, st.lists(_WORDS, max_size=4)).map(
    lambda t: [w for opt in t[0] for w in opt] + [t[1], *t[2]]
)
_ENV = st.dictionaries(
    st.sampled_from(
        [
            "MPSWRAP_CLIENT_LIMIT",
            "MPSWRAP_LOG_LEVEL",
            "MPSWRAP_KILL_GRACE",
            "MPSWRAP_VERIFY_ATTACH",
            "MPSWRAP_NO_SUCH",
        ]
    ),
    st.sampled_from(["abc", "0", "7", "debug", "warn", "-1", "", "1e3"]),
    max_size=2,
)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(argv=st.one_of(st.lists(_WORDS, max_size=7), _SHAPED), env=_ENV)
def test_no_argv_gives_a_traceback(
    argv: list[str],
    env: dict[str, str],
    node: SimNode,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Any argv: a documented exit code and, on failure, an ``mpswrap:`` line (+ hint);
    never an internal error. Launch modes only plan (``--dry-run``): nothing starts; ``stop``
    and ``start`` are left to the tests above."""
    for key, value in node.env(**env).items():
        monkeypatch.setenv(key, value)
    argv = ["--dry-run", *argv]
    try:
        code = cli.main(argv)
    finally:
        for key in env:
            monkeypatch.delenv(key, raising=False)
    out = capsys.readouterr()
    event(f"exit {code}")
    assert "internal error" not in out.err, (argv, out.err)
    if "--debug" not in argv:  # --debug asks for tracebacks
        assert "Traceback" not in out.err, (argv, out.err)
    assert code in {0, 1, 2, 3, 4, 126, 127}, (argv, code, out.err)
    if code not in (0, 4):
        lines = [ln for ln in out.err.splitlines() if not ln.startswith("hint: ")]
        errors = [ln for ln in lines if not ln.startswith("mpswrap: ignoring ")]
        assert errors and all(ln.startswith(("mpswrap: ", "usage: ")) for ln in errors[-1:])


# --- what a user tried: the grammar holds at its edges ------------------------------------
@pytest.mark.parametrize(
    "argv", [["config"], ["farm", "status"], ["help"], ["farm", "status", "--json", "t.txt"]]
)
def test_a_closed_stdout_exits_141_quietly(node: SimNode, argv: list[str]) -> None:
    """``mpswrap config | head -1``: the reader left before mpswrap wrote."""
    if "farm" in argv:  # a farm to report on
        (node.root / "t.txt").write_text("true\n")
        done = node.mpswrap("farm", "--per-gpu", "1", "t.txt")
        assert done.returncode == 0, done
    res = node.run_unread(*argv)
    assert res.returncode == 128 + signal.SIGPIPE, res.stderr
    assert res.stderr == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["config"],
        ["help"],
        ["--version"],
        ["version"],
        ["completion", "bash"],
        ["status", "--json"],
    ],
)
def test_an_output_that_cannot_be_written_is_one_line_exit_1(
    node: SimNode, argv: list[str]
) -> None:
    """``mpswrap config > /dev/full``: as coreutils' "write error", not an internal error."""
    with open("/dev/full", "w") as full:
        res = node.run_writing_to(full, *argv)
    assert res.stderr == "mpswrap: cannot write output: No space left on device\n"
    assert res.returncode == 1


def test_an_oserror_of_a_command_is_not_an_output_error(node: SimNode) -> None:
    """Only writing the output is: a directory the metrics cannot be written to is named."""
    res = node.mpswrap("metrics", "--textfile", "/proc")
    assert res.stderr.startswith(
        "mpswrap: --textfile: cannot write the metrics file (/proc/mpswrap.prom): No such file"
    )
    assert res.returncode == 2


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["farm", "--retries", ARABIC_ONE, "t.txt"], "--retries"),
        (["farm", "--retries", "1_0", "t.txt"], "--retries"),
        (["farm", "--retries", "99999999999999999999999", "t.txt"], "--retries"),
        (["farm", "--timeout", ARABIC_ONE, "t.txt"], "--timeout"),
        (["farm", "--timeout", "1e-320", "t.txt"], "--timeout"),
        (["farm", "--grace", "1e308", "t.txt"], "--grace"),
        (["farm", "--heartbeat", "1e308", "t.txt"], "--heartbeat"),
        (["farm", "--verify-timeout", "1e308", "t.txt"], "--verify-timeout"),
        (["farm", "--per-gpu", "1000000", "t.txt"], "--per-gpu"),
        (["run", "-n", ARABIC_ONE, "--", "true"], "-n"),
        (["--priority", ARABIC_ONE, "true"], "--priority"),
        (["status", "--watch", "inf"], "--watch"),
        (["demo", "--clients", "+4"], "--clients"),
        (["sim", "inventory", "--gpus", "-1", "x.json"], "--gpus"),
        (["sim", "inventory", "--gpus", "100000", "x.json"], "--gpus"),
    ],
)
def test_numbers_are_plain_ascii_decimals_within_a_named_limit(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    os.chdir(tmp_path)
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[1].startswith("hint: "), lines
    assert flag in lines[0] and lines[0].startswith("mpswrap: argument "), lines
    if flag == "--per-gpu":  # it is a whole number: the cap is the cause
        assert lines[0].endswith("from 1 to 999999"), lines
    assert not list(tmp_path.iterdir())


def test_no_option_takes_pythons_own_number_forms() -> None:
    """int() and float() take Arabic-Indic digits, '1_0', '1e308': every numeric option goes through
    ``values`` (cli.options.whole, seconds) instead."""
    loose = [
        f"{name} {action.option_strings}"
        for name, parser in cli.parsers().items()
        for action in parser._actions
        if action.type in (int, float)
    ]
    assert not loose


@pytest.mark.parametrize(
    "argv",
    [["--version", "status"], ["status", "--version"], ["--version", "farm", "t.txt"]],
)
def test_version_anywhere_among_the_options(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.startswith("mpswrap ")


def test_a_commands_option_may_come_before_its_word(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    os.chdir(tmp_path)
    assert cli.main(["--per-gpu", "2", "farm", "none.txt"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mpswrap: cannot read the task list (none.txt)"), err
    assert cli.main(["--bogus", "status"]) == 2
    assert capsys.readouterr().err.startswith("mpswrap: unknown option '--bogus'")


@pytest.mark.parametrize(
    ("argv", "first"),
    [
        (["farm", "--bogus"], "mpswrap: unknown option '--bogus'"),
        (
            ["farm", "--retrys", "2"],
            "mpswrap: unknown option '--retrys' (did you mean '--retries'?)",
        ),
        (
            ["help", "farm", "stauts"],
            "mpswrap: no command 'farm stauts' (did you mean 'farm status'?)",
        ),
        (
            ["farm", "stauts"],
            "mpswrap: cannot read the task list (stauts): No such file or directory"
            " (did you mean 'farm status'?)",
        ),
        (["sim", "inventory"], "mpswrap: the following arguments are required: FILE"),
    ],
)
def test_a_mistake_is_named_first_in_one_line(
    argv: list[str], first: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    os.chdir(tmp_path)
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == first
    assert len(lines) == 2 and lines[1].startswith("hint: "), lines


def test_help_of_a_launcher_is_the_overview(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["help"]) == 0
    overview = capsys.readouterr().out
    assert cli.main(["help", "srun"]) == 0
    assert capsys.readouterr().out == overview


def test_sim_inventory_takes_a_number_of_gpus(tmp_path: Path) -> None:
    assert cli.main(["sim", "inventory", str(tmp_path / "g.json"), "--gpus", "3"]) == 0
    assert (tmp_path / "g.json").stat().st_size > 0


def _run_with(node: SimNode, argv: list[str], shell: str) -> subprocess.CompletedProcess[str]:
    """``python -m mpswrap ARGV`` under ``sh -c`` with ``shell`` after it (``>&-``, ``<&-``,
    ``2>&-``): its exit code is the last line of standard output's replacement, a file."""
    out = node.root / "code.txt"
    words = " ".join(f"'{w}'" for w in [*MPSWRAP, *argv])
    script = f'{words} {shell}; echo "$?" > {out}'
    res = subprocess.run(
        ["sh", "-c", script], env=node.env(), cwd=node.root, text=True, capture_output=True
    )
    res.returncode = int(out.read_text())
    return res


@pytest.mark.parametrize("argv", [["config"], ["status", "--json"], ["version"]])
def test_a_stdout_closed_from_the_start_is_one_line_exit_1(node: SimNode, argv: list[str]) -> None:
    """``mpswrap config >&-``: a write fails as on a full disk, never an internal error."""
    res = _run_with(node, argv, ">&-")
    assert res.returncode == 1, res.stderr
    assert res.stderr == "mpswrap: cannot write output: Bad file descriptor\n", res.stderr


def test_a_run_with_stdout_closed_from_the_start_still_runs_and_says_nothing(
    node: SimNode,
) -> None:
    """Nothing for mpswrap to write: the ranks run and the run exits with their code."""
    res = _run_with(node, ["run", "-n", "1", "--", "true"], ">&-")
    assert res.returncode == 0 and "internal error" not in res.stderr, res.stderr


def test_a_task_list_on_a_closed_stdin_is_a_usage_error(node: SimNode) -> None:
    res = _run_with(node, ["farm", "-"], "<&-")
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("mpswrap: cannot read the task list (stdin): standard input:")


@pytest.mark.parametrize("shell", ["2>&-", "2>&1 | true"])
def test_a_usage_error_keeps_its_code_when_stderr_cannot_be_written(
    node: SimNode, shell: str
) -> None:
    """``mpswrap run -n 0 -- true 2>&1 | true``: the line is lost, the code still says 2."""
    script = ["run", "-n", "0", "--", "true"]
    if "|" in shell:  # the code of the pipeline's first command
        out = node.root / "code.txt"
        words = " ".join(f"'{w}'" for w in [*MPSWRAP, *script])
        line = f"(sleep 0.5; {words}; echo $? > {out}) 2>&1 | true; sleep 0.1"
        subprocess.run(["bash", "-c", line], env=node.env(), cwd=node.root, timeout=60)
        assert out.read_text().strip() == "2"
        return
    assert _run_with(node, script, shell).returncode == 2


def test_a_runs_output_to_a_reader_that_left_is_no_traceback(node: SimNode) -> None:
    """``mpswrap run -n 2 -- sh -c 'echo ...; sleep ...' | head -1``: the ranks' output is
    dropped once the reader left, with no traceback of the threads that copy it; the ranks
    run to their end and the run exits 141, as a program a shell pipe ends."""
    loop = "for i in 1 2 3 4 5; do echo line$i; sleep 0.1; done"
    res = node.run_unread("run", "-n", "2", "--", "sh", "-c", loop)
    assert "Traceback" not in res.stderr and "Exception" not in res.stderr, res.stderr
    assert res.returncode == 128 + signal.SIGPIPE, res.stderr


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "reader-left"])
def test_a_demo_cut_short_still_ends_everything_it_started(node: SimNode, how: str) -> None:
    """``mpswrap demo``, its reader gone after the first line (``| head -1``), or signalled
    once its clients attach: it ends its clients and daemons, removes its directory, and
    exits 141, or 128+N."""
    argv = [*MPSWRAP, "demo", "--simulate", "yes", "--clients", "4"]
    proc = subprocess.Popen(  # in the node's own directory: other demos run beside it
        argv,
        env=node.env(TMPDIR=str(node.root)),
        cwd=node.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    if how == "reader-left":
        proc.stdout.readline()
        proc.stdout.close()
    else:
        while "2. attaching" not in proc.stdout.readline():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(getattr(signal, how))
    _, err = proc.communicate(timeout=120)
    sig = signal.SIGPIPE if how == "reader-left" else getattr(signal, how)
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err and "internal error" not in err, err
    said = f"mpswrap: demo: interrupted by {sig.name}: its clients and daemons were ended"
    assert (said in err) is (how != "reader-left"), err  # a reader gone: the quiet 141
    assert not list(node.root.glob("mpswrap-demo-*")), "the demo's directory is left"
    left = node.leftovers()  # whatever has the node in its environment: the demo's TMPDIR
    assert not left, left


@pytest.mark.skipif(os.geteuid() != 0, reason="a second user reads root's archive")
def test_report_of_records_the_user_may_not_read_says_so_not_no_record(node: SimNode) -> None:
    """``log_archive`` root's 0700 directory with a record of job 77 in it: a user's
    ``mpswrap report 77`` names the directory it cannot read (exit 2), not "no record" (4)."""
    from tests.users import ensure_test_user

    archive = node.root / "archive"
    where = str(archive)
    job = ("--job", "77", "--node", "n1")
    assert node.mpswrap("start", "--gpus", "0", *job).returncode == 0
    assert node.mpswrap("stop", *job, MPSWRAP_LOG_ARCHIVE=where).returncode == 0
    archive.chmod(0o700)
    res = node.mpswrap("report", "77", user=ensure_test_user(), MPSWRAP_LOG_ARCHIVE=where)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(f"mpswrap: cannot read the teardowns' records ({archive}): ")
    assert node.mpswrap("report", "77", MPSWRAP_LOG_ARCHIVE=where).returncode == 0


def test_a_config_that_is_a_directory_is_one_line_exit_2(node: SimNode) -> None:
    """``--config /etc``: a file that cannot be read, as ``--config /nonexistent`` is, and
    no word of another user changing it (root owns it)."""
    res = node.mpswrap("config", "--config", str(node.root))
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(f"mpswrap: cannot read config file ({node.root}): "), res.stderr
    assert "other than root" not in res.stderr


def test_calibrate_counts_past_max_are_refused_not_ignored(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    os.chdir(tmp_path)
    assert cli.main(["calibrate", "--max", "4", "--counts", "1,8", "--", "true"]) == 2
    assert capsys.readouterr().err.startswith("mpswrap: --counts past --max (1,8): 8 copies")


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["--bogus"], "unknown option '--bogus' (did you mean '--gpus'?)"),
        (["--gpu", "2"], "unknown option '--gpu' (did you mean '--gpus'?)"),  # no abbreviation
        (["y"], "unexpected argument 'y'"),
    ],
)
def test_the_simulators_commands_keep_the_grammar_of_every_command(
    words: list[str], said: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    os.chdir(tmp_path)
    assert cli.main(["sim", "inventory", "gpus.json", *words]) == 2
    assert capsys.readouterr().err == f"mpswrap: {said}\nhint: mpswrap sim inventory --help\n"
    assert not (tmp_path / "gpus.json").exists()


@pytest.mark.parametrize("words", [["-v"], ["-q"], ["--debug"], ["-qq", "--verbose"]])
def test_the_simulators_commands_take_the_output_options_after_their_words(
    words: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Every command takes the output options anywhere on its line: so does ``sim``."""
    os.chdir(tmp_path)
    assert cli.main(["sim", "inventory", "gpus.json", *words]) == 0
    assert capsys.readouterr().out == "gpus.json\n" and (tmp_path / "gpus.json").is_file()


def test_sim_alone_asks_only_for_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sim"]) == 2
    said = capsys.readouterr().err
    assert said.startswith("mpswrap: the following arguments are required: COMMAND\n"), said


def test_a_runs_output_to_a_full_disk_is_said_exit_1(node: SimNode) -> None:
    """``mpswrap run -n 1 -- echo hi > /dev/full``: as mpswrap's own output, one line, exit 1
    (not the quiet 141 of a reader that left)."""
    with open("/dev/full", "w") as full:
        res = node.run_writing_to(full, "run", "-n", "1", "--", "echo", "hi")
    assert res.returncode == 1, res.stderr
    assert res.stderr.endswith("mpswrap: cannot write output: No space left on device\n")


def test_help_names_a_simulator_command_and_debug_adds_no_line_to_a_usage_error(
    node: SimNode,
) -> None:
    """``mpswrap help sim COMMAND`` is that command's help, as ``sim COMMAND --help``; with
    ``--debug`` a usage error is still its one line and hint (no traceback: there is none to
    show), while an operation's failure gains the traceback it asks for."""
    shown = node.mpswrap("help", "sim", "install-bin")
    assert shown.returncode == 0, shown
    assert shown.stdout.startswith("usage: mpswrap sim install-bin"), shown.stdout
    typo = node.mpswrap("help", "sim", "instal-bin")
    assert (typo.returncode, typo.stderr) == (
        2,
        "mpswrap: no command 'sim instal-bin' (did you mean 'sim install-bin'?)\n"
        "hint: mpswrap help sim\n",
    )
    usage = node.mpswrap("--debug", "run", "-n", "x", "--", "true")
    assert usage.returncode == 2
    assert usage.stderr.splitlines() == [
        "mpswrap: argument -n/--np: invalid value 'x': expected a whole number from 1 to 999999",
        "hint: mpswrap run --help",
    ]
    failed = node.mpswrap("--debug", "start", *JOB, MPSWRAP_CONTROL_BINARY="no-mps-control")
    assert failed.returncode == 1
    assert "Traceback" in failed.stderr and "mpswrap: failed" not in failed.stderr


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["version", "extra"], "extra"),
        (["status", "--json", "x"], "x"),
        (["completion", "bash", "y"], "y"),
    ],
)
def test_a_word_a_command_does_not_take_is_named_as_one(
    node: SimNode, argv: list[str], word: str
) -> None:
    """One wording for a word too many, as for an option nobody takes (not argparse's
    ``unrecognized arguments``), with the command's help as the hint."""
    res = node.mpswrap(*argv)
    assert (res.returncode, res.stderr) == (
        2,
        f"mpswrap: unexpected argument '{word}'\nhint: mpswrap {argv[0]} --help\n",
    )


def test_report_says_which_record_it_passed_over(node: SimNode) -> None:
    """A damaged record of the job is named, not hidden behind "no record"."""
    archive = node.root / "archive"
    archive.mkdir()
    (archive / "n1-78-g0-record.json").write_text("{not json")
    res = node.mpswrap("report", "78", MPSWRAP_LOG_ARCHIVE=str(archive))
    assert res.returncode == 4, res.stderr
    assert res.stderr.splitlines() == [
        f"mpswrap: passed over {archive}/n1-78-g0-record.json: not a record this mpswrap reads",
        f"mpswrap: no record of job 78 in {archive}",
    ], res.stderr


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        ((), {"MPSWRAP_KILL_GRACE": "abc"}, "mpswrap: bad value for kill_grace ('abc' in "),
        (("--config", "/nonexistent.conf"), {}, "mpswrap: cannot read config file ("),
    ],
    ids=["variable", "config"],
)
def test_demo_reads_the_settings_as_every_command(
    node: SimNode, args: tuple[str, ...], env: dict[str, str], line: str
) -> None:
    """A bad setting or a config file that is not there is exit 2 for ``demo`` too, before
    anything starts (it once ran on its own defaults, whatever the node said)."""
    argv = ("demo", "--simulate", "yes", "--clients", "1", *args)
    res = node.mpswrap(*argv, **env)  # type: ignore[arg-type]
    assert res.returncode == 2 and res.stderr.startswith(line), res.stderr
    assert not res.stdout


def test_status_of_a_gpu_whose_manifest_it_cannot_read_says_so_in_words(node: SimNode) -> None:
    """In user mode (root reads its own record instead), no ``None`` for the fields it could
    not read and no Python exception's name: the GPU, that its daemon is unknown, and where
    the file is not JSON; ``stop`` still ends it."""
    from tests.users import ensure_test_user

    user = ensure_test_user() if os.geteuid() == 0 else None
    assert node.mpswrap("start", "--gpus", "0", *JOB, user=user).returncode == 0
    manifest = node.layout("j1", admin=False).gpu("g0").root / "manifest.json"
    manifest.write_text("{bad")
    res = node.mpswrap("status", *JOB, user=user)
    assert res.returncode == 3, res
    assert "None" not in res.stdout and "Error" not in res.stdout, res.stdout
    assert "  g0 daemon unknown (no manifest read)\n" in res.stdout, res.stdout
    assert "not JSON (line 1 column 2)" in res.stdout, res.stdout
    assert node.mpswrap("stop", *JOB, user=user).returncode == 0


def test_a_demo_not_simulated_names_the_gpus_it_was_given(node: SimNode) -> None:
    """``--simulate no`` where the settings name a list of GPUs in NVML's place (the
    simulator's, here): the demo says whose GPUs it starts on, not "the real GPU"."""
    res = node.mpswrap("demo", "--simulate", "no", "--clients", "1")
    assert res.returncode == 0, res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith("1. starting one MPS daemon per GPU on the GPUs listed in /"), first
    assert "real GPU" not in res.stdout, res.stdout


def test_start_on_a_running_daemon_says_which_options_it_did_not_take(node: SimNode) -> None:
    """The daemon keeps what it started with: a second ``start`` with other settings says
    so, in one line naming them, and one with none given says nothing of it."""
    assert node.mpswrap("start", "--gpus", "0", *JOB).returncode == 0
    res = node.mpswrap("start", "--gpus", "0", "--threads", "30", "--cpus", "0", *JOB)
    assert res.returncode == 0, res.stderr
    assert "was already running: --threads, --cpus not applied (mpswrap stop, then start)" in (
        res.stderr
    ), res.stderr
    again = node.mpswrap("start", "--gpus", "0", *JOB)
    assert again.returncode == 0 and "not applied" not in again.stderr, again.stderr
    assert node.mpswrap("stop", *JOB).returncode == 0


def test_a_gpu_is_numbered_as_the_node_numbers_it(node: SimNode) -> None:
    """``--gpus 1``: the dry run, the farm's summary and its journal call that GPU 1, as
    nvidia-smi does, not 0 (its place among the run's GPUs)."""
    dry = node.mpswrap("run", "--dry-run", "--gpus", "1", "-n", "1", "--", "true")
    assert dry.returncode == 0 and dry.stdout.startswith("[0] gpu 1 (GPU-"), dry.stdout
    (node.root / "one.txt").write_text("true\n")
    res = node.mpswrap("farm", "--gpus", "1", "one.txt")
    assert res.returncode == 0, res.stderr
    assert "farm: 1 task: 1 done" in res.stdout, res.stdout
    row = next(line for line in res.stdout.splitlines() if "GPU-" in line)
    assert row.split()[0] == "1", res.stdout
    state = (node.root / "one.txt.farm" / "state.jsonl").read_text().splitlines()
    journal = [json.loads(line) for line in state]
    assert {e["gpu_index"] for e in journal if "gpu_index" in e} == {1}, journal
