"""scontrol's answer holds what the job's user wrote (its name, comment, paths): read as
hostile input, whatever its bytes and length, never an error of the prolog."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mpswrap import trust
from mpswrap.jobenv import JobEnv
from mpswrap.slurm.scontrol import SCONTROL_LIMIT, scontrol_job, show_fields

JOB = {"SLURM_JOB_ID": "42"}


def _fake_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: bytes) -> None:
    """An scontrol that prints ``body`` for ``show job``."""
    answer = tmp_path / "answer"
    answer.write_bytes(body)
    program = tmp_path / "scontrol"
    program.write_text(f"#!/bin/sh\nexec cat {answer}\n")
    program.chmod(0o755)
    monkeypatch.setattr(trust, "program", lambda name, path: str(program))


def test_bytes_that_are_not_utf8_are_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job submitted with ``-J $'\\xff\\xfe'`` and a comment naming MPS: its fields read."""
    _fake_scontrol(tmp_path, monkeypatch, b"JobId=42 JobName=\xff\xfebad Comment=use mps\n")
    job = scontrol_job(JobEnv(JOB))
    assert job == {"JobId": "42", "JobName": "\ufffd\ufffdbad", "Comment": "use mps"}


def test_an_answer_over_the_limit_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fake_scontrol(tmp_path, monkeypatch, b"JobId=42 Comment=" + b"x" * SCONTROL_LIMIT)
    with caplog.at_level(logging.WARNING):
        assert scontrol_job(JobEnv(JOB)) == {}
    assert "cannot query the job" in caplog.text


@pytest.mark.parametrize(
    ("line", "fields"),
    [
        (
            "JobId=1 JobName=a b  c UserId=u(1)",
            {"JobId": "1", "JobName": "a b  c", "UserId": "u(1)"},
        ),
        ("Comment=x=y z Gres=gpu:2(IDX:0-1)", {"Comment": "x=y z", "Gres": "gpu:2(IDX:0-1)"}),
        (
            "Nodes=n1 CPU_IDs=0-3 Mem=0 GRES=gpu:1(IDX:0)",
            {"Nodes": "n1", "CPU_IDs": "0-3", "Mem": "0", "GRES": "gpu:1(IDX:0)"},
        ),
        ("words before any field", {}),
        ("", {}),
    ],
)
def test_fields_of_one_line(line: str, fields: dict[str, str]) -> None:
    assert show_fields(line) == fields


def test_a_megabyte_of_gaps_and_words_is_read_in_one_pass() -> None:
    """Spaces then a long word in a comment: a backtracking pattern takes minutes on 64 KB
    of it (each space starts a new try over the rest); the field reader reads it once."""
    half = SCONTROL_LIMIT // 2
    fields = show_fields("JobId=1 Comment=x" + " " * half + "a" * half + " UserId=u(1)")
    assert len(fields["Comment"]) == 1 + 2 * half and fields["UserId"] == "u(1)"
