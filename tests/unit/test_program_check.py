"""A program that cannot run is refused before any daemon starts, with a shell's exit codes:
127 where nothing of that name is found, 126 where what is found cannot be executed, however
it is named (a path, or a name looked up on PATH as bash looks it up)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpswrap.errors import ProcError
from mpswrap.job.supervise import check_program


def _code(argv: list[str], path: str) -> int:
    with pytest.raises(ProcError) as err:
        check_program(argv, {"PATH": path})
    return err.value.exit_code


def _plain(folder: Path, name: str, mode: int) -> Path:
    folder.mkdir(exist_ok=True)
    program = folder / name
    program.write_text("#!/bin/sh\ntrue\n")
    program.chmod(mode)
    return program


def test_a_name_found_nowhere_is_127(tmp_path: Path) -> None:
    assert _code(["no-such-program-x"], str(tmp_path)) == 127


def test_a_name_on_path_only_as_a_plain_file_is_126(tmp_path: Path) -> None:
    """As bash: ``torchrun`` on PATH without its execute bit cannot be executed (126), not
    "not found" (127)."""
    _plain(tmp_path / "a", "torchrun", 0o644)
    assert _code(["torchrun"], str(tmp_path / "a")) == 126


def test_an_executable_later_on_path_is_the_one_run(tmp_path: Path) -> None:
    _plain(tmp_path / "a", "tool", 0o644)
    _plain(tmp_path / "b", "tool", 0o755)
    check_program(["tool"], {"PATH": f"{tmp_path / 'a'}:{tmp_path / 'b'}"})


def test_a_directory_of_that_name_is_passed_over(tmp_path: Path) -> None:
    (tmp_path / "a" / "tool").mkdir(parents=True)
    assert _code(["tool"], str(tmp_path / "a")) == 127


@pytest.mark.parametrize("mode", [0o644, 0o755])
def test_a_path_is_taken_as_given(tmp_path: Path, mode: int) -> None:
    program = _plain(tmp_path, "prog", mode)
    if mode & 0o111:
        check_program([str(program)], {"PATH": ""})
    else:
        assert _code([str(program)], "") == 126
    assert _code([str(tmp_path / "missing")], "") == 127
    assert _code([str(tmp_path)], "") == 126  # a directory


def test_a_rank_killed_by_a_signal_is_said_to_be() -> None:
    """What a rank's end is called when it ends the others: a SIGKILL is no "exit code 137"
    alone (a program may exit 137 itself)."""
    from mpswrap.job.supervise import ended_how

    assert ended_how(3) == "exited with code 3"
    assert ended_how(-9) == "was killed by signal 9 (SIGKILL, exit code 137)"
    assert ended_how(-64) == "was killed by signal 64 (SIGRTMAX, exit code 192)"
