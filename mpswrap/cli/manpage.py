"""The man page mpswrap(1), generated from the command table's parsers (modes, options, every
command with its description and examples), the exit codes and the settings. The wheel ships it as
``mpswrap/cli/mpswrap.1`` (tools/gen_reference.py writes it, a test compares);
``mpswrap help --man-path`` prints where it is: ``man -l "$(mpswrap help --man-path)"``."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import __version__
from ..config import ENV_PREFIX, FIELDS, OTHER_VARIABLES
from ..errors import EXIT_CODES

__all__ = ["SHIPPED", "roff", "shipped"]

#: The shipped page's file name, beside this module.
SHIPPED = "mpswrap.1"


def shipped() -> Path:
    """Where the installed package keeps its man page."""
    return Path(__file__).resolve().with_name(SHIPPED)


def _text(text: str) -> str:
    """Plain text as roff: backslashes escaped, ``-`` as the minus sign options are typed
    with, and no line that roff would read as a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(f"\\&{ln}" if ln.startswith((".", "'")) else ln for ln in text.split("\n"))


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%" in text:  # argparse help strings are %-templates
        text = text % {"default": action.default, "prog": "mpswrap"}
    return " ".join(text.split())


def _flags(action: argparse.Action) -> str:
    value = ""
    if action.nargs != 0:
        if action.choices is not None:
            value = "{" + ",".join(str(c) for c in action.choices) + "}"
        else:
            value = str(action.metavar or action.dest.upper())
    if not action.option_strings:
        return f"\\fI{_text(value)}\\fR"
    flags = ", ".join(f"\\fB{_text(f)}\\fR" for f in action.option_strings)
    return f"{flags} \\fI{_text(value)}\\fR" if value else flags


def _options(actions: list[argparse.Action]) -> list[str]:
    out = []
    for action in actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        out += [".TP", _flags(action), _text(_help(action))]
    return out


def _block(lines: list[str]) -> list[str]:
    return [".PP", ".RS 4", ".nf", *(_text(ln) for ln in lines), ".fi", ".RE"]


def _command(name: str, parser: argparse.ArgumentParser, common: set[str]) -> list[str]:
    usage = parser.usage or " ".join(parser.format_usage().split()[1:])
    out = [f'.SS "mpswrap {name}"', _text(" ".join((parser.description or "").split()))]
    out += _block([usage.replace("%(prog)s", f"mpswrap {name}")])
    own = [a for a in parser._actions if not set(a.option_strings) & common]
    out += _options([a for a in own if not isinstance(a, argparse._HelpAction)])
    text, _, status = (parser.epilog or "").partition("\n\n")
    examples = text.split("\n")[1:]
    if examples:
        out += [".PP", "Examples:", *_block([e.strip() for e in examples])]
    if status:
        out += [".PP", _text(status.split(" (")[0].capitalize() + ".")]
    return out


def roff(parsers: dict[str, argparse.ArgumentParser]) -> str:
    """The page for ``parsers`` (``cli.main.parsers()``: the launch modes' at ``""``, then
    each command's)."""
    parser = parsers[""]
    output = next(g for g in parser._action_groups if g.title == "output")
    common = {f for a in output._group_actions for f in a.option_strings}
    out = [
        f'.TH MPSWRAP 1 "" "mpswrap {__version__}" "User Commands"',
        ".SH NAME",
        "mpswrap \\- run many CUDA processes per GPU through NVIDIA MPS, on Slurm or alone",
        ".SH SYNOPSIS",
        *_block((parser.usage or "").split(" | ")),
        ".SH DESCRIPTION",
        *_block((parser.description or "").split("\n")),
        ".PP",
        _text(" ".join((parser.epilog or "").split())),
    ]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.option_strings]
        if actions and group.title not in ("positional arguments",):
            title = "OTHER OPTIONS" if group.title in ("options", "optional arguments") else ""
            out += [f'.SH "{title or _text(str(group.title).upper())}"', *_options(actions)]
    out += [".SH COMMANDS", "Every command also takes the output options."]
    for name, command in parsers.items():
        if name:
            out += _command(name, command, common)
    out += [".SH EXIT STATUS"]
    for code, text in EXIT_CODES:
        out += [".TP", f"\\fB{code}\\fR", _text(" ".join(text.replace("`", "").split()))]
    out += [".SH ENVIRONMENT", "Each setting, and its default (\\fBmpswrap config\\fR shows them):"]
    for field in FIELDS:
        out += [".TP", f"\\fB{_text(ENV_PREFIX + field.name.upper())}\\fR"]
        out += [_text(f"{field.doc} (default: {field.default})")]
    out += [".PP", "Besides those (who sets each, and what it means):"]
    for names, who, meaning in OTHER_VARIABLES:
        out += [".TP", ", ".join(f"\\fB{_text(n)}\\fR" for n in names)]
        out += [_text(f"{meaning} (set by {who})")]
    out += [
        ".SH FILES",
        ".TP",
        "\\fI/etc/mpswrap/mpswrap.conf\\fR",
        _text("The admin file (key = value lines), unless --config or MPSWRAP_CONFIG names one."),
        ".SH SEE ALSO",
        "\\fBnvidia\\-cuda\\-mps\\-control\\fR(1), \\fBsrun\\fR(1), \\fBmpirun\\fR(1)",
    ]
    return "\n".join(out) + "\n"
