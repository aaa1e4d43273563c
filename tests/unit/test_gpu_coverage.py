"""docs/gpu-coverage.md, the table of which features have run on a real GPU, checked against
the records it names so that it cannot rot unseen: each row names a record (with the commit
that record states) or says "simulator only"; each record lies in the tree; each GPU test a
row names passed in that row's records; each phase is one of the gpu tier's; each test run
without a GPU exists; every command of the CLI is named. Also: every document that names
exclusive mode says that it has run on the simulator only."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.tree import REPO

DOC = REPO / "docs" / "gpu-coverage.md"
RECORDS = (REPO / "docs" / "gpu-results", REPO / "benchmarks" / "results")
HEADER = "| feature | on a real GPU | what ran there | without a GPU |"
SIMULATOR_ONLY = "simulator only"
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_RECORD = re.compile(r"\[[^\]]*\]\(([^)\s]+)\) at ([0-9a-f]{7,40})\b")
_TEST = re.compile(r"`(test_\w+)`")
_FILE = re.compile(r"`(test_\w+\.py)`")
_PHASE = re.compile(r"\bphase `([\w-]+)`")


@dataclass(frozen=True)
class Row:
    feature: str
    gpu: str
    ran: str
    without: str

    @property
    def records(self) -> list[tuple[Path, str]]:
        """Each record the row links, and the commit the row says it names."""
        return [((DOC.parent / link).resolve(), sha) for link, sha in _RECORD.findall(self.gpu)]


def rows() -> list[Row]:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER) + 2
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"not four cells: {line}"
        table.append(Row(*cells))
    return table


def record_text(path: Path) -> str:
    """A record file's text, or the text of every file of a record folder."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)


ROWS = rows()


@pytest.mark.parametrize("row", ROWS, ids=[r.feature[:40] for r in ROWS])
def test_a_row_names_its_records_with_their_commits_or_says_simulator_only(row: Row) -> None:
    if row.gpu.startswith(SIMULATOR_ONLY):
        assert not _LINK.findall(row.gpu), f"{row.feature}: simulator only, yet a record"
        assert not _TEST.findall(row.ran), f"{row.feature}: simulator only, yet a GPU test"
        return
    links = _LINK.findall(row.gpu)
    assert links, f"{row.feature}: neither a record nor {SIMULATOR_ONLY!r}"
    assert len(row.records) == len(links), f"{row.feature}: a record without 'at <commit>'"


@pytest.mark.parametrize("row", ROWS, ids=[r.feature[:40] for r in ROWS])
def test_each_record_is_in_the_tree_and_names_the_commit(row: Row) -> None:
    for path, sha in row.records:
        assert path.exists(), f"{row.feature}: no record {path}"
        assert any(path.is_relative_to(root) for root in RECORDS), f"{path}: not a record"
        named = sha in record_text(path)
        assert named, f"{row.feature}: {path.relative_to(REPO)} does not name {sha}"


def test_every_link_of_the_page_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    links = [link.partition("#")[0] for link in _LINK.findall(text)]
    missing = [link for link in links if not (DOC.parent / link).exists()]
    assert not missing, missing


@pytest.mark.parametrize("row", [r for r in ROWS if r.records], ids=lambda r: r.feature[:40])
def test_each_gpu_test_a_row_names_passed_in_its_records(row: Row) -> None:
    text = "\n".join(record_text(path) for path, _ in row.records)
    named = _TEST.findall(row.ran)
    passed = [t for t in named if re.search(rf"^PASSED \S+::{t}\b", text, re.M)]
    assert passed == named, f"{row.feature}: not passed in its records: {set(named) - {*passed}}"


def test_each_phase_is_one_of_the_gpu_tiers() -> None:
    script = (REPO / "tests" / "gpu" / "run_gpu_tier.sh").read_text(encoding="utf-8")
    phases = set(re.findall(r"^ {4}([\w-]+)\)", script, re.M))
    named = {p for row in ROWS for p in _PHASE.findall(row.ran)}
    assert named and named <= phases, named - phases


def test_each_test_run_without_a_gpu_exists() -> None:
    sources = {p.name: p.read_text(encoding="utf-8") for p in (REPO / "tests").rglob("*.py")}
    defined = {t for text in sources.values() for t in re.findall(r"^def (test_\w+)", text, re.M)}
    for row in ROWS:
        files = _FILE.findall(row.without)
        assert all(f in sources for f in files), f"{row.feature}: {files}"
        tests = _TEST.findall(row.without)
        assert all(t in defined for t in tests), f"{row.feature}: {set(tests) - defined}"


def test_every_command_of_the_cli_is_named() -> None:
    reference = (REPO / "docs" / "reference.md").read_text(encoding="utf-8")
    table = reference.split("<!-- generated: commands -->", 1)[1].split("<!-- end generated", 1)[0]
    commands = re.findall(r"^\| `mpswrap ([\w-]+)` \|", table, re.M)
    text = DOC.read_text(encoding="utf-8")
    assert commands
    assert [c for c in commands if not re.search(rf"`mpswrap {c}[ `]", text)] == []


#: What a reader follows: the README, docs/, the admin guide, the changelog.
READ = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "slurm" / "README.md",
    REPO / "CHANGELOG.md",
]
_EXCLUSIVE = re.compile(r"`exclusive_process`|EXCLUSIVE_PROCESS")


def _units(text: str) -> list[str]:
    """A document's paragraphs, each table row on its own."""
    units: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.splitlines()
        units += [ln for ln in lines if ln.startswith("|")]
        units.append("\n".join(ln for ln in lines if not ln.startswith("|")))
    return units


@pytest.mark.parametrize("path", READ, ids=lambda p: str(p.relative_to(REPO)))
def test_a_document_naming_exclusive_mode_says_it_ran_on_the_simulator_only(path: Path) -> None:
    units = _units(path.read_text(encoding="utf-8"))
    if not any(_EXCLUSIVE.search(u) for u in units):
        return
    said = [u for u in units if _EXCLUSIVE.search(u) and SIMULATOR_ONLY in " ".join(u.split())]
    assert said, f"{path.relative_to(REPO)} names exclusive mode but not '{SIMULATOR_ONLY}'"
