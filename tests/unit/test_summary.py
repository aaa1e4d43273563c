"""The end-of-run summary line (``mpswrap.report.summary``): its wording, pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpswrap.job.outcomes import Outcome, collect, peek
from mpswrap.job.state import outcomes_dir
from mpswrap.paths import JobLayout
from mpswrap.report.summary import BY_EPILOG, NodeSummary, teardown_words


def line(outcomes: list[Outcome], teardown: str = "clean", ended: int = 0) -> str:
    return NodeSummary("n1", outcomes, teardown, ended).line(now=112.5)


def test_every_rank_fine() -> None:
    outs = [Outcome(0, True, start=100.0), Outcome(0, True, start=101.0)]
    assert line(outs) == (
        "mpswrap: summary: node n1: 2 ranks, 2 attached, exit codes 0, 0 ended by "
        "terminate_client, teardown clean, 12.50 s"
    )


def test_mixed_codes_count_each_and_ladders_add_up() -> None:
    outs = [Outcome(1, True, 1, 100.0), Outcome(0, False, 0, 100.0), Outcome(143, True, 2, 0.0)]
    outs += [Outcome(1, True, 0, 100.0)]
    assert line(outs, teardown_words(2), ended=3) == (
        "mpswrap: summary: node n1: 4 ranks, 3 attached (1 not seen), exit codes 0 (1), "
        "1 (2), 143 (1), 6 ended by terminate_client, teardown left 2 behind, 12.50 s"
    )


@pytest.mark.parametrize(
    ("attached", "words"),
    [
        ([None, None], "attach not checked"),
        ([True, None], "1 attached (1 not checked)"),
        ([False, None], "0 attached (1 not seen, 1 not checked)"),
        ([False, False], "0 attached (2 not seen)"),
    ],
)
def test_attach_wording(attached: list[bool | None], words: str) -> None:
    outs = [Outcome(0, a, start=100.0) for a in attached]
    assert f"2 ranks, {words}, exit codes 0," in line(outs)


def test_one_rank_by_the_epilog() -> None:
    assert line([Outcome(3, True, start=112.5)], BY_EPILOG).endswith(
        ": 1 rank, 1 attached, exit codes 3, 0 ended by terminate_client, teardown by the "
        "epilog, 0.00 s"
    )


@pytest.mark.parametrize(
    "record",
    [
        [],
        "x",
        {"code": "0", "attached": True},
        {"code": 0, "attached": "yes"},
        {"code": 0, "attached": None, "ended": 1.5},
        {"code": 0, "attached": None, "start": True},
        # What root's status prints of them stays bounded: no code past a shell's, no
        # 4,000-digit one (a job user writes the records).
        {"code": -1, "attached": None},
        {"code": 256, "attached": None},
        {"code": 10**4000, "attached": None},
        {"code": 0, "attached": None, "ended": -1},
        {"code": 0, "attached": None, "ended": 10**4000},
    ],
)
def test_a_record_that_is_no_outcome_is_refused(record: object) -> None:
    with pytest.raises(ValueError):
        Outcome.from_json(record)


def test_a_record_round_trips() -> None:
    out = Outcome(137, False, 2, 5.25)
    assert Outcome.from_json({"code": 137, "attached": False, "ended": 2, "start": 5.25}) == out


@pytest.mark.parametrize(
    "text",
    ["[" * 20000 + "]" * 20000, '[{"rank": 1' + "0" * 5000 + "}]", "[1e400]", "{]"],
    ids=["nested-past-the-parser", "5000-digit-number", "infinite", "not-json"],
)
def test_a_run_record_nested_past_any_parser_is_skipped(tmp_path: Path, text: str) -> None:
    """The job's user writes a record no rank wrote: ``status`` (peek) and the last rank's
    summary (collect) skip it and read the rest, never an internal error."""
    layout = JobLayout(tmp_path, "n1", "7")
    folder = outcomes_dir(layout)
    folder.mkdir(parents=True)
    (folder / "1-0000000a.json").write_text(text)
    assert peek(layout) == []
    assert collect(layout) == []
    assert not folder.exists()
