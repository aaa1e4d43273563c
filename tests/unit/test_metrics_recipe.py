"""One recipe for node_exporter: docs/howto-metrics.md holds the systemd units, every document
that names a textfile directory names theirs, and systemd accepts the units as written."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from mpswrap.cli.commands import COMMANDS
from tests.docblocks import runnable_blocks
from tests.tree import REPO

HOWTO = REPO / "docs" / "howto-metrics.md"
GUIDE = REPO / "slurm" / "README.md"
DOCS = [REPO / "README.md", GUIDE, *sorted((REPO / "docs").glob("*.md"))]
#: A fenced unit file: its first line names where it goes.
_UNIT = re.compile(
    r"^```ini\n# (/etc/systemd/system/(mpswrap-metrics\.\w+))\n(.*?)^```$", re.M | re.S
)
#: ``--textfile DIR`` with an absolute DIR (a runnable block's relative one is the reader's).
_TEXTFILE = re.compile(r"--textfile\s+(/[^\s`'\"]+)")


def _units() -> dict[str, str]:
    """The recipe's unit files: name -> text."""
    found = {m[2]: m[3] for m in _UNIT.finditer(HOWTO.read_text(encoding="utf-8"))}
    assert sorted(found) == ["mpswrap-metrics.service", "mpswrap-metrics.timer"], found
    return found


def _recipe_dir() -> str:
    (dirs,) = {m[1] for m in _TEXTFILE.finditer(_units()["mpswrap-metrics.service"])}
    return dirs


def test_the_units_live_in_the_howto_alone() -> None:
    units = _units()
    assert "OnUnitActiveSec=15s" in units["mpswrap-metrics.timer"]
    assert "AccuracySec=1s" in units["mpswrap-metrics.timer"], "else a minute's slack"
    venv = re.search(r"^export VENV=(\S+)", GUIDE.read_text(encoding="utf-8"), re.M)
    assert venv, "the admin guide's VENV"
    service = units["mpswrap-metrics.service"]
    assert f"ExecStart={venv[1]}/bin/mpswrap metrics --all --textfile " in service
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        assert not re.search(r"^(?:[\d*/,-]+\s+){5}.*mpswrap metrics", text, re.M), (
            f"{doc.name}: a crontab line; the recipe is a systemd timer"
        )
        if doc != HOWTO:
            assert "[Timer]" not in text and "ExecStart=" not in text, (
                f"{doc.name}: a second copy of the units; point at {HOWTO.name}"
            )


def test_every_document_names_the_recipes_directory() -> None:
    wanted = _recipe_dir()
    texts = {str(doc.relative_to(REPO)): doc.read_text(encoding="utf-8") for doc in DOCS}
    # The bad-input table's rows name wrong directories on purpose.
    bad_inputs = texts.get("docs/reliability.md", "").splitlines()
    texts["docs/reliability.md"] = "\n".join(ln for ln in bad_inputs if "| path |" not in ln)
    texts["mpswrap/cli/commands.py"] = "\n".join(e for c in COMMANDS for e in c.examples)
    named = {(where, m[1]) for where, text in texts.items() for m in _TEXTFILE.finditer(text)}
    assert {where for where, _ in named} >= {"docs/howto-metrics.md", "slurm/README.md"}, named
    assert {d for _, d in named} == {wanted}, sorted(named)
    assert all(b.code.count("--textfile /") == 0 for b in runnable_blocks(HOWTO))


def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is needed (Debian: systemd; tools/test.sh installs it)"
    units = _units()
    for name, text in units.items():
        (tmp_path / name).write_text(text)
    res = subprocess.run(
        [analyze, "verify", *(str(tmp_path / name) for name in sorted(units))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (res.returncode, res.stdout + res.stderr) == (0, ""), res.stdout + res.stderr
