"""Bash completion, generated from the command table's parsers: the command words (``farm
status`` too) and launchers, each command's options, and the values of options that have a
fixed set (``--policy``) or name a file or directory, and nothing after one whose value is
a number or a name (``-n``, ``--job``). ``mpswrap completion bash`` prints it;
the wheel ships the same text as ``mpswrap/cli/mpswrap.bash`` (tools/gen_reference.py writes
it, a test compares)."""

from __future__ import annotations

import argparse
import re
import shlex
from collections import defaultdict

from .options import LAUNCHERS

__all__ = ["SHIPPED", "bash"]

#: The shipped script's file name, beside this module.
SHIPPED = "mpswrap.bash"

_WORD = re.compile(r"^[\w@%+=:,./-]+$")
#: What a value is, by its metavar, where it has no fixed choices.
_FILES, _DIRS = {"FILE", "TASKS", "PATH"}, {"DIR"}


def _words(words: list[str]) -> str:
    bad = [w for w in words if not _WORD.match(w)]
    assert not bad, f"not a plain word for bash: {bad}"
    return " ".join(words)


def _value_kind(action: argparse.Action) -> str | None:
    """``words:A B``, ``files``, ``dirs``, ``topics`` (a command's name, help's) or None
    (nothing to offer) for an action's value."""
    if action.choices is not None:
        return "words:" + _words([str(c) for c in action.choices])
    if action.metavar == "COMMAND":
        return "topics"
    if action.metavar in _FILES:
        return "files"
    if action.metavar in _DIRS:
        return "dirs"
    return None


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [f for a in parser._actions for f in a.option_strings]


def _valued(parser: argparse.ArgumentParser) -> list[str]:
    return [
        f for a in parser._actions if a.option_strings and a.nargs != 0 for f in a.option_strings
    ]


def _reply(kind: str) -> str:
    if kind == "nothing":  # a number, a name: no option name is its value
        return "COMPREPLY=()"
    if kind == "files":
        return 'COMPREPLY=($(compgen -f -- "$cur"))'
    if kind == "dirs":
        return 'COMPREPLY=($(compgen -d -- "$cur"))'
    return f'COMPREPLY=($(compgen -W "{kind[len("words:") :]}" -- "$cur"))'


def _topics(parsers: dict[str, argparse.ArgumentParser]) -> str:
    """help's words: a command, or after the first word of a two-word one (farm), its
    second (status)."""
    seconds: dict[str, list[str]] = defaultdict(list)
    for name in parsers:
        if " " in name:
            seconds[name.split()[0]].append(name.split()[1])
    arms = " ".join(
        f"{shlex.quote(f)}) {_reply('words:' + _words(s))} ;;" for f, s in seconds.items()
    )
    top = _reply("words:" + _words([n for n in parsers if n and " " not in n]))
    return f"case $prev in {arms} *) {top} ;; esac"


def _value_cases(parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """``case "$cmd $prev"`` arms: the values of the option before the cursor."""
    by_kind: dict[str, list[str]] = defaultdict(list)
    for name, parser in parsers.items():
        for action in parser._actions:
            kind = (_value_kind(action) or "nothing") if action.nargs != 0 else None
            if kind is not None and action.option_strings:
                by_kind[kind] += [shlex.quote(f"{name} {flag}") for flag in action.option_strings]
    return [
        f"        {'|'.join(keys)}) {_reply(kind)}; return ;;" for kind, keys in by_kind.items()
    ]


def _command_cases(parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """``case $cmd`` arms: each command's options, or its positional's values (and the words
    of its own commands, ``farm``'s ``status``)."""
    arms = []
    for name, parser in parsers.items():
        if not name:
            continue
        positional = [a for a in parser._actions if not a.option_strings]
        kind = _value_kind(positional[0]) if positional else None
        more = [n.split()[1] for n in parsers if n.startswith(f"{name} ")]
        if kind and kind.startswith("words:"):  # sim's: its positional's choices already
            more = [word for word in more if word not in kind.split(":", 1)[1].split()]
        words = f'words="{_words(_options(parser))}"'
        if kind:
            reply = _topics(parsers) if kind == "topics" else _reply(kind)
            if more:
                reply = reply[:-1] + f' $(compgen -W "{_words(more)}" -- "$cur"))'
            words += f"; [[ $cur == -* ]] || {{ {reply}; return; }}"
        arms.append(f"        {shlex.quote(name)}) {words} ;;")
    return arms


def bash(parsers: dict[str, argparse.ArgumentParser]) -> str:
    """The completion script for ``parsers`` (``cli.main.parsers()``: the launch modes' at
    ``""``, then each command's)."""
    parser = parsers[""]
    commands = [*(n for n in parsers if n and " " not in n), *LAUNCHERS]
    pairs = "|".join(shlex.quote(n) for n in parsers if " " in n)
    # A command's options may come before its word too (mpswrap --per-gpu 2 farm tasks.txt):
    # every option that takes a value somewhere, and is a flag nowhere, is skipped with it.
    valued = {f for p in parsers.values() for f in _valued(p)}
    flags = {f for p in parsers.values() for f in _options(p)} - {
        f for p in parsers.values() for a in p._actions if a.nargs != 0 for f in a.option_strings
    }
    skip = "|".join(sorted(valued - flags))
    lines = [
        "# bash completion for mpswrap, generated from its parser: mpswrap completion bash",
        "_mpswrap() {",
        "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}",
        '    local cmd="" i=1 words=""',
        "    # --opt=value is three words (COMP_WORDBREAKS has '='): the option is prev",
        '    [ "$prev" = "=" ] && prev=${COMP_WORDS[COMP_CWORD-2]}',
        "    # the command word: the first word after mpswrap's own options (and their values)",
        '    while [ "$i" -lt "$COMP_CWORD" ]; do',
        "        case ${COMP_WORDS[i]} in",
        "            --) cmd=--; break ;;",
        f"            {skip})",
        '                [ "${COMP_WORDS[i+1]}" = "=" ] && i=$((i + 1))',
        "                i=$((i + 2)); continue ;;",
        "            -*) ;;",
        "            *) cmd=${COMP_WORDS[i]}; break ;;",
        "        esac",
        "        i=$((i + 1))",
        "    done",
        "    # a command of two words (farm status)",
        '    if [ $((i + 1)) -lt "$COMP_CWORD" ]; then',
        '        case "$cmd ${COMP_WORDS[i+1]}" in',
        f'            {pairs}) cmd="$cmd ${{COMP_WORDS[i+1]}}"; i=$((i + 1)) ;;',
        "        esac",
        "    fi",
        "    # after a -- (run, calibrate) the words are the program's",
        '    while [ $((i += 1)) -lt "$COMP_CWORD" ]; do',
        '        [ "${COMP_WORDS[i]}" = -- ] && cmd=--',
        "    done",
        '    case "$cmd $prev" in',
        *_value_cases(parsers),
        "    esac",
        "    case $cmd in",
        f'        "") if [[ $cur == -* ]]; then words="{_words(_options(parser))}"; '
        f'else words="{_words(commands)}"; fi ;;',
        *_command_cases(parsers),
        "        *) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;  # a launcher's, a program's",
        "    esac",
        '    COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "}",
        "complete -o default -F _mpswrap mpswrap",
    ]
    return "\n".join(lines) + "\n"
