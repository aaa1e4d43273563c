"""Write the generated sections of docs/reference.md from the code, so the reference cannot
drift from it.

    python tools/gen_reference.py           rewrite the sections in place
    python tools/gen_reference.py --check   exit 1 (and say so) when the file differs

Each section lies between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``; the
prose outside the markers is hand-written and kept. Sources: the one CLI parser
(``mpswrap.cli.main.build_parser``: usage, modes, every command and option), the settings
table (``mpswrap.config.FIELDS``), the exit codes (``mpswrap.errors.EXIT_CODES``), a status
client's fields (``mpswrap.mps.control.CLIENT_FIELDS``), a job record's
(``mpswrap.mps.record.FIELDS``), the metric series
(``mpswrap.report.metrics.FAMILIES``), ``mpswrap.session`` (signature, docstring, what it
returns), ``mpswrap.farm`` and ``mpswrap.unshield``. It also writes the files the wheel ships
that are made from the parser: the man page ``mpswrap/cli/mpswrap.1`` and the bash completion
``mpswrap/cli/mpswrap.bash``.
tests/unit/test_reference.py runs the check.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere: the tree's mpswrap, not another
    sys.path.insert(0, str(REPO))

REFERENCE = REPO / "docs" / "reference.md"
FIX = "python tools/gen_reference.py"
_SECTION = re.compile(
    r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S
)


# --- small formatting helpers -----------------------------------------------------------------
def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: object) -> str:
    return f"`{text}`".replace("|", "\\|")


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


#: "(default: ...)" in a help text, parentheses inside it allowed once.
_DEFAULT = re.compile(r"\s*\(default: ((?:[^()]|\([^()]*\))*)\)")


def _help_text(action: argparse.Action) -> str:
    text = action.help or ""
    if "%" in text:  # argparse help strings are %-templates
        text = text % {"default": action.default, "prog": "mpswrap"}
    return text


def _help(action: argparse.Action) -> str:
    """The meaning, without the default (its own column)."""
    return _cell(_DEFAULT.sub("", _help_text(action)))


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return str(action.metavar or action.dest.upper())


def _default(action: argparse.Action) -> str:
    """What the help text says the default is, else the parser's: every option shows one."""
    said = _DEFAULT.search(_help_text(action))
    if said:
        return _cell(said[1])
    if action.required or "(required)" in _help_text(action):
        return "required"
    kinds = {argparse._CountAction: "0", argparse._VersionAction: "—"}
    shown = kinds.get(type(action), "off" if action.nargs == 0 else "")
    if shown or action.default in (None, argparse.SUPPRESS):
        return shown
    return _code(action.default)


def _option_rows(actions: list[argparse.Action]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for action in actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        value = _value(action)
        if action.option_strings:
            flags = ", ".join(action.option_strings)
            shown = f"{flags} {value}".strip()
        else:
            shown = value if action.nargs not in ("?", "*") else f"[{value}]"
        rows.append((_code(shown), _default(action), _help(action)))
    return rows


def _common_flags() -> set[str]:
    """The output options: the top-level parser's "output" group."""
    from mpswrap.cli.main import build_parser

    groups = build_parser()._action_groups
    return {
        f for g in groups if g.title == "output" for a in g._group_actions for f in a.option_strings
    }


def launchers() -> tuple[str, ...]:
    from mpswrap.cli.options import LAUNCHERS

    return tuple(LAUNCHERS)


def _own(actions: list[argparse.Action]) -> list[argparse.Action]:
    """``actions`` without the output options every command accepts (listed once)."""
    common = _common_flags()
    return [a for a in actions if not set(a.option_strings) & common]


def _options_table(actions: list[argparse.Action]) -> list[str]:
    rows = _option_rows(actions)
    return _table(("option", "default", "meaning"), rows) if rows else ["(no options)"]


def _usage(parser: argparse.ArgumentParser) -> str:
    if parser.usage:
        return parser.usage
    words = [parser.prog]
    for action in _own(parser._actions):
        if isinstance(action, argparse._HelpAction):
            continue
        value = _value(action)
        if action.option_strings:
            word = f"{action.option_strings[0]} {value}".strip()
            words.append(word if action.required else f"[{word}]")
        else:
            words.append(f"[{value}]" if action.nargs in ("?", "*") else value)
    return " ".join(words)


# --- the sections -------------------------------------------------------------------------------
def commands() -> list[str]:
    from mpswrap.cli.commands import COMMANDS
    from mpswrap.cli.main import parsers

    parser_of = parsers()
    out = _table(
        ("command", "what it does"),
        [(_code(f"mpswrap {c.name}"), _cell(c.summary)) for c in COMMANDS],
    )
    for c in COMMANDS:
        name, cmd = c.name, parser_of[c.name]
        out += ["", f"### `mpswrap {name}`", "", _cell(c.description)]
        out += ["", "```", _usage(cmd), "```", ""]
        out += _options_table(_own(cmd._actions))
        text, _, status = (cmd.epilog or "").partition("\n\n")
        examples = [e.strip() for e in text.split("\n")[1:]]
        out += ["", "Examples:", "", "```", *examples, "```"] if examples else []
        codes = status.split(" (")[0].removeprefix("exit status: ")
        out += ["", f"Exit status: {codes} ([exit codes](#exit-codes))."] if status else []
    return out


def modes() -> list[str]:
    from mpswrap.cli.main import build_parser

    parser = build_parser()
    out = ["```", f"usage: {parser.usage}", "", parser.description or "", "```", ""]
    out += [_cell(parser.epilog or ""), ""]
    out += [f"Launchers (prefix mode): {', '.join(_code(w) for w in launchers())}."]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        actions = [a for a in actions if not isinstance(a, argparse._SubParsersAction)]
        if actions and group.title not in ("positional arguments",):
            # argparse names its own group "options" (3.10+) or "optional arguments" (3.9)
            title = (
                "other options" if group.title in ("options", "optional arguments") else group.title
            )
            title = title if "options" in (title or "") else f"{title} options"
            out += ["", f"{_cell(title).capitalize()}:", ""]
            out += _options_table(actions)
    return out


def settings() -> list[str]:
    from mpswrap.config import ENV_PREFIX, FIELDS

    rows = [
        (_code(f.name), _code(ENV_PREFIX + f.name.upper()), _code(f.default), _cell(f.doc))
        for f in FIELDS
    ]
    return _table(("setting", "environment variable", "default", "meaning"), rows)


def exit_codes() -> list[str]:
    from mpswrap.errors import EXIT_CODES

    return _table(("code", "meaning"), [(code, _cell(text)) for code, text in EXIT_CODES])


def _signature(func: Callable[..., Any], name: str) -> str:
    parts, star = [], False
    for param in inspect.signature(func).parameters.values():
        if param.kind is param.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        text = param.name
        if param.default is not param.empty:
            default = param.default
            text += "=" + (f'"{default}"' if isinstance(default, str) else repr(default))
        parts.append(text)
    return f"{name}({', '.join(parts)})"


def python_api() -> list[str]:
    import mpswrap
    from mpswrap.job.attached import Session

    out = ["```python", _signature(mpswrap.session, "mpswrap.session"), "```", ""]
    out += [_rst(inspect.getdoc(mpswrap.session) or ""), ""]
    out += ["`with mpswrap.session() as s:` gives `s`, a `Session`:", ""]
    rows: list[tuple[str, ...]] = [
        (_code(f"s.{f.name}"), _type_name(f.type)) for f in dataclasses.fields(Session)
    ]
    for name, member in inspect.getmembers(Session, inspect.isfunction):
        if not name.startswith("_"):
            doc = (inspect.getdoc(member) or "").split("\n\n")[0]
            call = _signature(member, f"s.{name}").replace("(self, ", "(")
            rows.append((_code(call), _cell(_rst(doc))))
    out += _table(("attribute or method", "type or meaning"), rows)
    out += ["", "```python", _signature(mpswrap.farm, "mpswrap.farm"), "```", ""]
    out += [_rst(inspect.getdoc(mpswrap.farm) or ""), ""]
    from mpswrap.entry.farm import FarmResult

    fields = [
        (_code(f"result.{f.name}"), _type_name(f.type)) for f in dataclasses.fields(FarmResult)
    ]
    out += _table(("attribute", "type"), fields)
    out += ["", "```python", _signature(mpswrap.unshield, "mpswrap.unshield"), "```", ""]
    out += [_rst(inspect.getdoc(mpswrap.unshield) or "")]
    out += ["", "Errors (all exported by `mpswrap`; each pickles):", ""]
    rows = []  # reused: (class, bases, meaning)
    for name in mpswrap.__all__:
        obj = getattr(mpswrap, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            bases = ", ".join(_code(b.__name__) for b in obj.__bases__)
            rows.append((_code(name), bases, _cell((inspect.getdoc(obj) or "").split("\n")[0])))
    return out + _table(("class", "bases", "meaning"), rows)


def _type_name(annotation: object) -> str:
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "?")
    return _code(name)


def _rst(text: str) -> str:
    """Docstring markup (``code``) as Markdown (`code`)."""
    return text.replace("``", "`")


def status_clients() -> list[str]:
    from mpswrap.mps.control import CLIENT_FIELDS

    return _table(("field", "meaning"), [(_code(k), _cell(v)) for k, v in CLIENT_FIELDS.items()])


def job_record() -> list[str]:
    from mpswrap.mps.record import FIELDS

    return _table(("field", "meaning"), [(_code(k), _cell(v)) for k, v in FIELDS.items()])


def metric_series() -> list[str]:
    from mpswrap.report.metrics import FAMILIES

    return _table(
        ("series", "type", "labels", "meaning"),
        [(_code(f.name), f.kind, ", ".join(f.labels), _cell(f.help)) for f in FAMILIES],
    )


def other_variables() -> list[str]:
    from mpswrap.config import OTHER_VARIABLES

    return _table(
        ("variable", "set by", "meaning"),
        [
            (", ".join(map(_code, names)), _cell(who), _cell(what))
            for names, who, what in OTHER_VARIABLES
        ],
    )


SECTIONS: dict[str, Callable[[], list[str]]] = {
    "other-variables": other_variables,
    "modes": modes,
    "commands": commands,
    "settings": settings,
    "exit-codes": exit_codes,
    "status-clients": status_clients,
    "metric-series": metric_series,
    "job-record": job_record,
    "python-api": python_api,
}


# --- the file -----------------------------------------------------------------------------------
def render(text: str) -> str:
    """``text`` with every generated section rebuilt; a section missing or unknown is an error."""
    seen: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in SECTIONS:
            raise SystemExit(f"{REFERENCE}: unknown generated section {name!r}")
        seen.append(name)
        return match[1] + "\n".join(SECTIONS[name]()) + "\n" + match[4]

    new = _SECTION.sub(replace, text)
    # Defaults that name this interpreter (`install-hooks --python`) differ per machine.
    new = new.replace(sys.executable, "PYTHON")
    missing = [n for n in SECTIONS if n not in seen]
    if missing:
        raise SystemExit(f"{REFERENCE}: no '<!-- generated: {missing[0]} -->' section")
    return new


def shipped() -> dict[Path, str]:
    """The files the wheel ships that are made from the parser: the man page and the bash
    completion script, each path with the text it must have."""
    from mpswrap.cli import completion, manpage
    from mpswrap.cli.main import parsers

    folder = REPO / "mpswrap" / "cli"
    return {
        folder / manpage.SHIPPED: manpage.roff(parsers()),
        folder / completion.SHIPPED: completion.bash(parsers(simulator=True)),
    }


def diff(current: str, wanted: str, name: str = "docs/reference.md") -> Iterator[str]:
    import difflib

    yield from difflib.unified_diff(
        current.splitlines(), wanted.splitlines(), name, "generated", lineterm=""
    )


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--check", action="store_true", help="fail if a file is out of date")
    check = args.parse_args(argv).check
    current = REFERENCE.read_text(encoding="utf-8")
    files = {REFERENCE: (current, render(current))}
    for path, text in shipped().items():
        files[path] = (path.read_text(encoding="utf-8") if path.exists() else "", text)
    stale = [path for path, (now, wanted) in files.items() if now != wanted]
    for path in stale:
        name = str(path.relative_to(REPO))
        if check:
            print("\n".join(diff(*files[path], name)))
            print(f"{name} is out of date with the code: run `{FIX}`", file=sys.stderr)
        else:
            path.write_text(files[path][1], encoding="utf-8")
            print(f"wrote {name}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
