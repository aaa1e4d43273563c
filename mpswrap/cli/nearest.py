"""The nearest word: what a mistyped command, option or help topic was likely meant to be."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["did_you_mean"]


def did_you_mean(word: str, words: Sequence[str]) -> str:
    """`` (did you mean 'X'?)`` for a close match only: the one word that starts with
    ``word`` (of several, one a letter away: 'gpu' is 'gpus', not 'gpus-per-rank'), or one a
    typo or two away (difflib's ratio 0.75: 'stauts', 'hlep', 'polcy'); else nothing ('logs'
    is no 'prolog'; 'sta' could be start or status)."""
    import difflib

    if not word:
        return ""
    starting = [w for w in words if w.startswith(word)]
    if len(starting) > 1:
        starting = difflib.get_close_matches(word, starting, n=1, cutoff=0.8) or [""]
    near = starting or difflib.get_close_matches(word, words, n=1, cutoff=0.75)
    near = [w for w in near if w]
    return f" (did you mean '{near[0]}'?)" if near else ""
