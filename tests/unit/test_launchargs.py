"""Finding the program on srun / mpirun command lines, and wrapping it (launchargs)."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpswrap.cli.main import build_parser, split_options
from mpswrap.errors import UsageError
from mpswrap.job import launchargs as la
from mpswrap.job.launchers import LAUNCHERS, OPEN_MPI, SRUN, TORCHRUN, launcher_of

W = ["python", "-m", "mpswrap", "--"]


@pytest.mark.parametrize(
    ("argv", "wrapped"),
    [
        (["srun", "-n", "4", "./a", "-n", "3"], ["srun", "-n", "4", *W, "./a", "-n", "3"]),
        (["srun", "--ntasks=4", "./a"], ["srun", "--ntasks=4", *W, "./a"]),
        (["srun", "-o", "out.%t", "./a"], ["srun", "-o", "out.%t", *W, "./a"]),
        (["srun", "--cpus-per-task", "2", "./a"], ["srun", "--cpus-per-task", "2", *W, "./a"]),
        (["srun", "-N2", "-c", "2", "./a"], ["srun", "-N2", "-c", "2", *W, "./a"]),
        (["srun", "--gres=gpu:2", "x"], ["srun", "--gres=gpu:2", *W, "x"]),
        (["srun", "-ln4", "x"], ["srun", "-ln4", *W, "x"]),  # getopt cluster: -l -n 4
        (["srun", "-lun", "4", "x"], ["srun", "-lun", "4", *W, "x"]),
        (["srun", "--ntasks-per", "2", "x"], ["srun", "--ntasks-per", "2", *W, "x"]),
        (["srun", "--lab", "x", "1"], ["srun", "--lab", *W, "x", "1"]),  # prefix of --label
        (["srun", "-K", "x"], ["srun", "-K", *W, "x"]),  # optional value only attached
        (["srun", "--unknown=v", "-y", "x"], ["srun", "--unknown=v", "-y", *W, "x"]),
        (["srun", "-n", "2", "--", "x", "--"], ["srun", "-n", "2", "--", *W, "x", "--"]),
        (
            ["mpirun", "-np", "6", "-x", "VAR", "--map-by", "ppr:2:node", "./a", "-np", "1"],
            ["mpirun", "-np", "6", "-x", "VAR", "--map-by", "ppr:2:node", *W, "./a", "-np", "1"],
        ),
        (
            ["mpirun", "--mca", "btl", "self", "-H", "h:2", "--hostfile", "f", "a"],
            ["mpirun", "--mca", "btl", "self", "-H", "h:2", "--hostfile", "f", *W, "a"],
        ),
        (
            ["mpiexec", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "a"],
            ["mpiexec", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", *W, "a"],
        ),
        (["orterun", "-np=2", "a"], ["orterun", "-np=2", *W, "a"]),
        (
            ["mpirun", "-n", "1", "a", ":", "-n", "2", "b", "x"],
            ["mpirun", "-n", "1", *W, "a", ":", "-n", "2", *W, "b", "x"],
        ),
        (["/bin/mpirun.openmpi", "-c", "2", "a"], ["/bin/mpirun.openmpi", "-c", "2", *W, "a"]),
        (["mpirun", "--version"], ["mpirun", "--version"]),
        (
            ["srun", "-n", "1", "a", ":", "-n", "2", "b"],
            ["srun", "-n", "1", *W, "a", ":", "-n", "2", *W, "b"],
        ),
    ],
)
def test_wrap_examples(argv: list[str], wrapped: list[str]) -> None:
    assert la.wrap(argv, W) == wrapped


def test_parsed_options_are_canonical() -> None:
    seg = la.parse(["srun", "-ln4", "--nodes=2", "--cpus-per-task", "3", "a"]).segments[0]
    assert seg.options == (
        ("l", ()),
        ("ntasks", ("4",)),
        ("nodes", ("2",)),
        ("cpus-per-task", ("3",)),
    )
    seg = la.parse(["mpirun", "-mca", "a", "b", "-c", "5", "-H", "x,y", "p"]).segments[0]
    assert seg.options == (("mca", ("a", "b")), ("np", ("5",)), ("host", ("x,y",)))
    assert seg.program == ("p",)


@pytest.mark.parametrize(
    "argv",
    [
        ["srun", "--multi-prog", "tasks.conf"],
        ["srun", "-n", "4", "--multi", "tasks.conf"],  # prefix of --multi-prog
        ["mpirun", "--app", "appfile"],
        ["mpiexec", "-configfile", "cfg"],
    ],
)
def test_programs_in_a_file_are_refused_with_a_hint(argv: list[str]) -> None:
    with pytest.raises(UsageError) as info:
        la.parse(argv)
    text = info.value.render()
    assert "file" in text
    assert "hint: put mpswrap in front of each program" in text
    assert info.value.exit_code == 2


@pytest.mark.parametrize("argv", [["srun", "-n"], ["mpirun", "--mca", "a"], ["mpirun", "-x"]])
def test_missing_values_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(UsageError, match="needs"):
        la.parse(argv)


def test_unknown_launcher_is_refused() -> None:
    assert launcher_of("mpirun.openmpi") is OPEN_MPI
    assert launcher_of("/opt/slurm/bin/srun") is SRUN
    assert launcher_of("/venv/bin/torchrun") is TORCHRUN
    assert launcher_of("./app") is None
    with pytest.raises(UsageError) as info:
        la.parse(["./app"])
    assert info.value.hint == "use srun, mpirun, mpiexec, orterun, torchrun"


@pytest.mark.parametrize(
    ("argv", "tokens", "program"),
    [
        (
            ["torchrun", "--nproc-per-node", "8", "train.py", "--lr", "1"],
            ["--nproc-per-node", "8", "--no-python"],
            ["/venv/bin/python", "train.py", "--lr", "1"],
        ),
        (
            ["torchrun", "--nproc_per_node=4", "--standalone", "-m", "pkg.train", "-x"],
            ["--nproc_per_node=4", "--standalone", "--no-python"],
            ["/venv/bin/python", "-m", "pkg.train", "-x"],
        ),
        (
            ["torchrun", "--nnodes", "2", "--no-python", "./serve", "--port", "1"],
            ["--nnodes", "2", "--no-python"],
            ["./serve", "--port", "1"],
        ),
    ],
    ids=["script", "module", "no-python"],
)
def test_torchrun_workers_run_the_wrapper_then_the_interpreter(
    argv: list[str], tokens: list[str], program: list[str]
) -> None:
    """torchrun runs its script with Python itself: its workers run ``--no-python`` through
    the wrapper, then torchrun's interpreter (and ``-m`` for ``--module``)."""
    line = la.parse(argv, python="/venv/bin/python")
    assert line.argv(["W", "--"]) == ["torchrun", *tokens, "W", "--", *program]
    assert la.ranks_per_node(line, {}) == (
        8 if "8" in argv else 4 if "--nproc_per_node=4" in argv else None
    )


def test_every_launcher_row_names_local_rank_variables_jobenv_reads() -> None:
    from mpswrap.jobenv import LOCAL_RANK_VARS, LOCAL_SIZE_VARS

    for row in LAUNCHERS:
        assert set(row.local_rank) <= set(LOCAL_RANK_VARS), row.family
        assert row.local_size[0] in (*LOCAL_SIZE_VARS, "SLURM_STEP_TASKS_PER_NODE"), row.family


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["mpirun", "-np", "49", "a"], {}, 49),  # no hosts, no allocation: all here
        (["mpirun", "-np", "6", "-H", "a,b", "p"], {}, 3),
        (["mpirun", "-np", "6", "--hostfile", "f", "p"], {}, None),
        (["mpirun", "--map-by", "ppr:2:node", "p"], {}, 2),
        (["mpirun", "-N", "5", "p"], {}, 5),
        (["mpirun", "-np", "8", "p"], {"SLURM_JOB_ID": "1", "SLURM_NNODES": "2"}, 4),
        (["mpirun", "-n", "2", "a", ":", "-n", "3", "b"], {}, 5),
        (["mpirun", "p"], {}, None),
        (["srun", "-n", "9", "-N", "2", "a"], {}, 5),
        (["srun", "-n", "9", "-N", "1-3", "a"], {}, 3),  # the fewest some node must get
        (["srun", "--ntasks-per-node=7", "a"], {}, 7),
        (["srun", "-n", "9", "a"], {}, None),  # outside an allocation: Slurm decides
        (["srun", "-n", "9", "a"], {"SLURM_NNODES": "3"}, 3),
    ],
)
def test_ranks_per_node(argv: list[str], env: dict[str, str], expected: int | None) -> None:
    assert la.ranks_per_node(la.parse(argv), env) == expected


def test_extra_options_go_first_in_each_segment() -> None:
    line = la.parse(["mpirun", "-n", "1", "a", ":", "-n", "1", "b"])
    assert line.argv(["w"], ["-x", "V"]) == [
        "mpirun",
        "-x",
        "V",
        "-n",
        "1",
        "w",
        "a",
        ":",
        "-x",
        "V",
        "-n",
        "1",
        "w",
        "b",
    ]


def test_wrapper_options_end_at_first_word_or_dashdash() -> None:
    valued = build_parser()
    assert split_options(["--gpus", "0", "srun", "-n", "2"], valued) == (
        ["--gpus", "0"],
        ["srun", "-n", "2"],
        False,
    )
    assert split_options(["--dry-run", "--", "run", "-x"], valued) == (
        ["--dry-run"],
        ["run", "-x"],
        True,
    )
    assert split_options(["--policy=cyclic", "./a", "--gpus"], valued) == (
        ["--policy=cyclic"],
        ["./a", "--gpus"],
        False,
    )
    assert split_options(["-vv", "--gpus=1", "run"], valued) == (
        ["-vv", "--gpus=1"],
        ["run"],
        False,
    )


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--gpu", "0", "run"], "unknown option '--gpu' (did you mean '--gpus'?)"),
        (["--polcy=block", "./a"], "unknown option '--polcy' (did you mean '--policy'?)"),
        (["--no-such", "./a"], "unknown option '--no-such'"),
    ],
)
def test_an_option_nobody_takes_is_refused_by_name(argv: list[str], named: str) -> None:
    with pytest.raises(UsageError) as caught:
        split_options(argv, build_parser())
    assert caught.value.line() == named


# --- properties --------------------------------------------------------------------------
NOT_SEP = st.text(max_size=6).filter(lambda t: t != ":")
VALUE = st.text(min_size=1, max_size=6).filter(lambda t: t != ":")
PROGRAM = st.text(alphabet=string.ascii_letters + string.digits + "./_", min_size=1, max_size=8)
ARGS = st.lists(NOT_SEP, max_size=4)
SRUN_FLAG_LETTERS = "lQuvXZEHOs"
SRUN_LONG_FLAGS = sorted(la.SRUN_FLAGS - {"multi-prog"})


@st.composite
def srun_option(draw: st.DrawFn) -> tuple[list[str], list[tuple[str, tuple[str, ...]]]]:
    """(tokens, expected parsed options) of one srun option in a random spelling."""
    kind = draw(st.sampled_from(["short", "cluster", "long=", "long", "flag", "shortflag"]))
    if kind in ("short", "cluster"):
        letter = draw(st.sampled_from(sorted(la.SRUN_SHORT)))
        value = draw(VALUE)
        flags = draw(st.text(alphabet=SRUN_FLAG_LETTERS, max_size=3)) if kind == "cluster" else ""
        parsed = [(f, ()) for f in flags] + [(la.SRUN_SHORT[letter], (value,))]
        attached = draw(st.booleans())
        tokens = [f"-{flags}{letter}{value}"] if attached else [f"-{flags}{letter}", value]
        return tokens, parsed  # type: ignore[return-value]
    if kind in ("long=", "long"):
        name = draw(st.sampled_from(sorted(la.SRUN_VALUED)))
        value = draw(VALUE) if kind == "long" else draw(NOT_SEP)
        tokens = [f"--{name}={value}"] if kind == "long=" else [f"--{name}", value]
        return tokens, [(name, (value,))]
    if kind == "flag":
        name = draw(st.sampled_from(SRUN_LONG_FLAGS))
        return [f"--{name}"], [(name, ())]
    letter = draw(st.sampled_from(SRUN_FLAG_LETTERS))
    return [f"-{letter}"], [(letter, ())]


OMPI_VALUED = sorted(n for n, (_, count) in la._OMPI_TABLE.items() if count)
OMPI_FLAGS = ["oversubscribe", "allow-run-as-root", "bind-to-core", "tag-output", "q", "v"]


@st.composite
def ompi_option(draw: st.DrawFn) -> tuple[list[str], list[tuple[str, tuple[str, ...]]]]:
    dashes = draw(st.sampled_from(["-", "--"]))
    if draw(st.booleans()):
        name = draw(st.sampled_from(OMPI_FLAGS))
        return [f"{dashes}{name}"], [(name, ())]
    name = draw(st.sampled_from(OMPI_VALUED))
    canonical, count = la._OMPI_TABLE[name]
    values = [draw(VALUE) for _ in range(count)]
    return [f"{dashes}{name}", *values], [(canonical, tuple(values))]


@st.composite
def segment(
    draw: st.DrawFn, option: st.SearchStrategy[tuple[list[str], list[tuple[str, tuple[str, ...]]]]]
) -> tuple[list[str], list[tuple[str, tuple[str, ...]]], bool, list[str]]:
    opts = draw(st.lists(option, max_size=5))
    tokens = [t for toks, _ in opts for t in toks]
    parsed = [p for _, ps in opts for p in ps]
    dashdash = draw(st.booleans())
    program = [draw(PROGRAM), *draw(ARGS)]
    return tokens, parsed, dashdash, program


def _check(
    launcher: str,
    segments: list[tuple[list[str], list[tuple[str, tuple[str, ...]]], bool, list[str]]],
) -> None:
    argv, expected = [launcher], [launcher]
    for index, (tokens, _, dashdash, program) in enumerate(segments):
        sep = [":"] if index else []
        dd = ["--"] if dashdash else []
        argv += [*sep, *tokens, *dd, *program]
        expected += [*sep, *tokens, *dd, *W, *program]
    line = la.parse(argv)
    assert line.argv(W) == expected  # wrapper exactly once before each program
    assert line.argv() == argv  # nothing else changes
    for seg, (_, parsed, dashdash, program) in zip(line.segments, segments, strict=False):
        assert list(seg.program) == program  # the program's own arguments untouched
        assert list(seg.options) == parsed
        assert seg.dashdash == dashdash


@settings(max_examples=300, deadline=None)
@given(st.lists(segment(srun_option()), min_size=1, max_size=3))
def test_srun_property(
    segments: list[tuple[list[str], list[tuple[str, tuple[str, ...]]], bool, list[str]]],
) -> None:
    _check("srun", segments)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(segment(ompi_option()), min_size=1, max_size=3),
    st.sampled_from(["mpirun", "mpiexec", "orterun"]),
)
def test_mpirun_property(
    segments: list[tuple[list[str], list[tuple[str, tuple[str, ...]]], bool, list[str]]],
    launcher: str,
) -> None:
    _check(launcher, segments)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["srun", "mpirun"]), st.lists(NOT_SEP, max_size=8))
def test_any_command_line_parses_or_is_a_usage_error(launcher: str, rest: list[str]) -> None:
    """Garbage in: the parser never crashes and never loses or invents a token."""
    try:
        line = la.parse([launcher, *rest])
    except UsageError:
        return
    assert line.argv() == [launcher, *rest]
