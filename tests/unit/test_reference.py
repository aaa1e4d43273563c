"""docs/reference.md is what tools/gen_reference.py makes from the code: the parser (modes,
commands, options), the settings table, the exit codes and session()."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from tests.tree import PACKAGE, REPO


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_reference", REPO / "tools" / "gen_reference.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_matches_the_code() -> None:
    gen = _generator()
    current = gen.REFERENCE.read_text(encoding="utf-8")
    wanted = gen.render(current)
    diff = "\n".join(gen.diff(current, wanted))
    assert current == wanted, f"docs/reference.md is out of date: run `{gen.FIX}`\n{diff}"


def test_the_shipped_man_page_and_completion_match_the_parser() -> None:
    """mpswrap/cli/mpswrap.1 and mpswrap.bash are what the generator makes from the parser,
    and the package data the wheel ships (pyproject.toml). Read where the imported mpswrap
    has them: the tree, or the installed wheel (the python tier tests the wheel)."""
    import mpswrap.cli

    gen = _generator()
    shipped = gen.shipped()
    assert {p.name for p in shipped} == {"mpswrap.1", "mpswrap.bash"}
    installed = Path(mpswrap.cli.__file__).parent
    for path, text in shipped.items():
        found = installed / path.name
        assert found.read_text(encoding="utf-8") == text, f"{found}: run `{gen.FIX}`"
    data = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '"mpswrap.cli" = ["mpswrap.1", "mpswrap.bash"]' in data


def test_every_setting_command_and_exit_code_is_in_the_generated_text() -> None:
    """The sections say what they are built from (a guard on the generator itself)."""
    from mpswrap.cli.commands import COMMANDS
    from mpswrap.config import FIELDS
    from mpswrap.errors import EXIT_CODES

    text = "\n".join(line for section in _generator().SECTIONS.values() for line in section())
    for name in (c.name for c in COMMANDS):
        assert f"### `mpswrap {name}`" in text
    for field in FIELDS:
        assert f"`MPSWRAP_{field.name.upper()}`" in text
        assert field.doc.split()[0] in text
    for code, _ in EXIT_CODES:
        assert f"\n| {code} |" in text
    for word in ("policy=None", "timeout=None", "abort_on_error=True"):
        assert word in text


# --- doc drift: what the docs cite must exist ---------------------------------------------------
#: The documents a reader follows: README, docs/, the admin guide, the examples.
CITING = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "slurm" / "README.md",
    *sorted(p for p in (REPO / "examples").iterdir() if p.is_file()),
]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_PATH = re.compile(
    r"(?<![\w/.$~<-])((?:examples|tools|tests|docs|benchmarks|slurm|mpswrap|lab|notes|\.ci)"
    r"/[\w./*-]*[\w*])"
)
_VAR = re.compile(r"\bMPSWRAP_[A-Z0-9_]*[A-Z0-9]\b")
_CALL = re.compile(r"\b(session|check_attached|is_client)\(([^()]*)\)")


def _deliberate() -> set[str]:
    """Words and variables docs/reliability.md's bad-input table names on purpose because
    they are wrong: the table is generated from these cases, and test_bad_input asserts what
    mpswrap says to each."""
    from tests.functional.bad_input_table import CASES

    return {word for case in CASES for word in (*case.argv, *case.env)}


#: Named on purpose because they do not exist.
DELIBERATE = _deliberate()
#: Programs a doc may run as ``mpswrap PROGRAM`` (per-rank mode) by bare name.
PROGRAMS = {"python", "python3", "sleep", "env", "bash", "hostname", "nvidia-smi"}


def _docs() -> list[tuple[Path, str]]:
    return [(p, p.read_text(encoding="utf-8")) for p in CITING if p.exists()]


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s", "-", text)


def _located(path: Path) -> Path:
    """Where a file of the checkout is in the tree under test: the package's files lie in
    the package under test (an installed wheel's, in CI), the rest in the checkout."""
    try:
        return PACKAGE / path.relative_to(REPO / "mpswrap")
    except ValueError:
        return path


def _anchors(path: Path) -> set[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {_slug(line.lstrip("#")) for line in lines if line.startswith("#")}


def test_every_relative_link_exists() -> None:
    bad = []
    for path, text in _docs():
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = _located((path.parent / file).resolve()) if file else path
            if not dest.exists():
                bad.append(f"{path.relative_to(REPO)}: link to {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{path.relative_to(REPO)}: link to {target}: no such heading")
    assert not bad, "\n".join(bad)


def _cited(cited: str) -> list[Path]:
    """The files a path a doc cites (a glob, maybe) names, in the tree under test."""
    root = PACKAGE.parent if cited.startswith("mpswrap/") else REPO
    return list(root.glob(cited)) if "*" in cited else [root / cited]


def test_every_cited_repository_path_exists() -> None:
    bad = []
    for path, text in _docs():
        for match in set(_PATH.findall(text)):
            cited = match.rstrip(".")
            if not any(p.exists() for p in _cited(cited)):
                bad.append(f"{path.relative_to(REPO)}: cites {cited}, which does not exist")
    assert not bad, "\n".join(bad)


def test_every_mpswrap_variable_named_in_the_docs_exists() -> None:
    from mpswrap.config import ENV_PREFIX, FIELDS

    source = "".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))
    known = {ENV_PREFIX + f.name.upper() for f in FIELDS}
    bad = [
        f"{path.relative_to(REPO)}: {var} is neither a setting nor read by mpswrap"
        for path, text in _docs()
        for var in sorted(set(_VAR.findall(text)))
        if var not in known and var not in source and var not in DELIBERATE
    ]
    assert not bad, "\n".join(bad)


def test_session_calls_in_the_docs_use_real_keywords() -> None:
    import inspect

    import mpswrap
    from mpswrap.job.attached import Session

    params = {
        "session": set(inspect.signature(mpswrap.session).parameters),
        "check_attached": set(inspect.signature(Session.check_attached).parameters),
        "is_client": set(inspect.signature(Session.is_client).parameters),
    }
    bad = [
        f"{path.relative_to(REPO)}: {name}({args}): no keyword {word!r}"
        for path, text in _docs()
        for name, args in _CALL.findall(text)
        for word in re.findall(r"(\w+)\s*=", args)
        if word not in params[name]
    ]
    assert not bad, "\n".join(bad)


def _code_lines(text: str) -> list[str]:
    """Command lines of a document: the lines of its fenced blocks (except shown output)
    and its inline code spans."""
    lines, fence, skip, mark = [], "", False, False
    for line in text.splitlines():
        if fence:
            if line.startswith(fence):
                fence = ""
            elif not skip:
                lines.append(line)
            continue
        opened = re.match(r"^(`{3,})", line)
        if opened:
            fence, skip = opened[1], mark
            continue
        mark = line.strip() == "<!-- output -->" or (mark and not line.strip())
        lines += re.findall(r"(?<!`)`([^`\n]+)`(?!`)", line)
    return lines


def _parser_facts() -> tuple[dict[str, set[str]], set[str], set[str]]:
    """Options of each command ("" for the top level), the valued top-level options, and
    every first word mpswrap takes as a command or a launcher."""
    from mpswrap.cli.main import parsers

    gen = _generator()
    options = {
        name: {f for a in p._actions for f in a.option_strings} for name, p in parsers().items()
    }
    valued = {f for a in parsers()[""]._actions if a.nargs != 0 for f in a.option_strings}
    return options, valued, {*(n for n in options if n), *gen.launchers()}


def _check_invocation(
    words: list[str], facts: tuple[dict[str, set[str]], set[str], set[str]]
) -> str | None:
    """What is wrong with ``mpswrap WORDS`` as a doc writes it, or None."""
    options, valued, _ = facts
    index = 0
    while index < len(words) and words[index].startswith("-") and words[index] != "--":
        flag = words[index].split("=")[0]
        if flag not in options[""] and flag not in DELIBERATE:
            return f"no option {flag}"
        index += 2 if flag in valued and "=" not in words[index] else 1
    if index >= len(words) or words[index] == "--" or words[index].endswith(":"):
        return None  # ends at `--`, or a message's prefix (`mpswrap prolog: ...`)
    problems = [_check_word(w, words[index + 1 :], facts) for w in words[index].split("|")]
    return next((p for p in problems if p), None)


def _check_word(
    word: str, rest: list[str], facts: tuple[dict[str, set[str]], set[str], set[str]]
) -> str | None:
    options, _, firsts = facts
    if rest and f"{word} {rest[0]}" in options:  # a command of two words (farm status)
        word, rest = f"{word} {rest[0]}", rest[1:]
    if word in options:  # a command: its own options, up to a `--`
        flags = [w.split("=")[0] for w in (rest[: rest.index("--")] if "--" in rest else rest)]
        wrong = [f for f in flags if re.fullmatch(r"--?[a-z][\w-]*", f) and f not in options[word]]
        wrong = [f for f in wrong if f not in DELIBERATE]
        return f"`mpswrap {word}` has no option {wrong[0]}" if wrong else None
    placeholder = word[0] in "[<….~$/" or word.isupper() or word.startswith("...")
    if word in firsts or placeholder or "/" in word or word in PROGRAMS or word in DELIBERATE:
        return None
    return f"unknown command {word!r}"


def test_every_mpswrap_command_line_in_the_docs_parses() -> None:
    facts = _parser_facts()
    bad = []
    for path, text in _docs():
        for line in _code_lines(text):
            for match in re.finditer(r"(?<![\w/.$<-])mpswrap[ \t]+(?=([^\n]*))", line):
                rest = re.split(r"\s(?:#|&&|\|\||\|)|;|[`)]", match[1])[0]
                problem = _check_invocation(rest.split(), facts)
                if problem:
                    bad.append(f"{path.relative_to(REPO)}: `mpswrap {rest.strip()}`: {problem}")
    assert not bad, "\n".join(bad)


def test_the_concepts_module_table_lists_every_module() -> None:
    """docs/concepts.md "Where things live in the code": one row a folder, its modules in the
    tree's files and in the layer order tests/unit/test_import_rules.py enforces."""
    from tests.unit.test_import_rules import LAYERS

    rows = re.findall(
        r"^\| `mpswrap/([\w/]*)` \| ([^|]*) \|",
        (REPO / "docs" / "concepts.md").read_text(encoding="utf-8"),
        re.M,
    )
    listed = {folder.rstrip("/"): re.findall(r"`(\w+)`", mods) for folder, mods in rows}
    bad = []
    for folder in sorted({p.parent for p in PACKAGE.rglob("__init__.py")}):
        name = str(folder.relative_to(PACKAGE)).replace(".", "")
        if name == "sim" or "sim/" in name:
            continue  # one row, no module list: the simulator stands apart from the layers
        modules = {p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")}
        order = [m for m in LAYERS.get(name, ()) if m in modules]
        if listed.get(name) != order or set(order) != modules:
            tree = order or sorted(modules)
            bad.append(f"mpswrap/{name}: the table lists {listed.get(name)}; the tree has {tree}")
    assert not bad, "docs/concepts.md, Where things live in the code:\n" + "\n".join(bad)
