"""Shell blocks of the docs that a test runs, and the output they show.

A fenced block right after a ``<!-- runnable -->`` line is run; a fenced block right after
an ``<!-- output -->`` line is what the runnable block before it prints (stdout and stderr
together). In shown output, a line ``...`` stands for any number of lines and ``...`` inside
a line for any text. The blocks of one document run in order as one shell session: exported
variables and the working directory carry from one block to the next.

A block that is meant to fail shows it: ``mpswrap status || echo "exit code $?"``; any other
non-zero status fails the document's test. A block runs under ``set -e``; a process it leaves
in the background must not hold its output (``... > file 2>&1 &``).

Tags say where a block runs (tests/functional/test_doc_blocks.py runs all but ``admin``):

- none: on the MPS simulator, in the functional tier;
- ``setup``: the tutorial's simulator set-up, which also runs before every other document's
  blocks (a how-to then starts where the tutorial's step 1 left off);
- ``mpi``: needs Open MPI's ``mpirun`` and mpi4py as well (the document's test is marked mpi);
- ``admin``: slurm/README.md only, run by the integration tier under a real Slurm.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "TAGS",
    "Block",
    "Ran",
    "doc_env",
    "matches",
    "problems",
    "run_blocks",
    "runnable_blocks",
]

#: Every tag a runnable block may carry ("" is no tag); see the module doc.
TAGS = ("", "setup", "mpi", "admin")

_FENCE = re.compile(r"^(`{3,})(.*)$")
_MARK = re.compile(r"^<!--\s*(runnable|output)(?::\s*([\w.-]+))?\s*-->\s*$")


@dataclass
class Block:
    """One runnable block: where it is, its code, its tag, the output it shows (or None)."""

    path: Path
    line: int
    code: str
    tag: str = ""
    output: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


@dataclass
class Ran:
    block: Block
    returncode: int
    output: str


def runnable_blocks(path: Path) -> list[Block]:
    """The document's runnable blocks in order, each with the output block that follows it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    mark: tuple[str, str] | None = None
    index = 0
    while index < len(lines):
        found = _MARK.match(lines[index].strip())
        fence = _FENCE.match(lines[index])
        if found:
            mark = (found.group(1), found.group(2) or "")
        elif fence:
            end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith(fence[1]))
            body = "\n".join(lines[index + 1 : end]) + "\n"
            if mark and mark[0] == "runnable":
                blocks.append(Block(path, index + 2, body, mark[1]))
            elif mark and mark[0] == "output":
                if not blocks or blocks[-1].output is not None:
                    raise ValueError(f"{path}:{index + 1}: output block without a runnable one")
                blocks[-1].output = body
            mark = None
            index = end
        elif lines[index].strip():
            mark = None
        index += 1
    return blocks


def matches(shown: str, actual: str) -> bool:
    """Whether ``actual`` fits ``shown`` (``...`` lines and ``...`` inside lines are wild)."""
    pattern = []
    for line in shown.rstrip("\n").splitlines():
        if line.strip() == "...":
            pattern.append(r"(?:[^\n]*\n)*?")
        else:
            parts = (re.escape(p) for p in line.rstrip().split("..."))
            pattern.append(r"[^\n]*".join(parts) + r"[ \t]*\n")
    return re.fullmatch("".join(pattern), actual.rstrip("\n") + "\n") is not None


def run_blocks(
    blocks: Sequence[Block], env: Mapping[str, str], cwd: Path, state: Path, timeout: float = 120.0
) -> list[Ran]:
    """Run ``blocks`` in order with bash (``set -e``); ``state`` keeps exports and the
    directory between them. Stops after the first block that fails."""
    state.write_text(f"cd {_quote(str(cwd))}\n")
    done: list[Ran] = []
    for block in blocks:
        script = (
            f"source {_quote(str(state))}\nset -e\n{block.code}\n"
            f"{{ export -p; echo cd {_quote_var('PWD')}; }} > {_quote(str(state))}\n"
        )
        proc = subprocess.run(
            ["bash", "-c", script],
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
        done.append(Ran(block, proc.returncode, proc.stdout))
        if proc.returncode:
            break
    return done


def problems(done: Sequence[Ran], blocks: Sequence[Block]) -> list[str]:
    """What went wrong: a block that exited non-zero, printed other than it shows, or never
    ran (after an earlier failure); each names the block's file and line."""
    found = []
    for ran in done:
        where = ran.block.where
        if ran.returncode:
            found.append(f"{where}: exit status {ran.returncode}; output:\n{ran.output}")
        elif ran.block.output is not None and not matches(ran.block.output, ran.output):
            found.append(
                f"{where}: output differs from the document's.\n--- shown:\n"
                f"{ran.block.output}--- printed:\n{ran.output}"
            )
    found += [f"{b.where}: not run (an earlier block failed)" for b in blocks[len(done) :]]
    return found


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _quote_var(name: str) -> str:
    return f'"$(printf %q "${name}")"'


def doc_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without mpswrap's own variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPSWRAP_", "CUDA_MPS_"))}
    return {**env, **(extra or {})}
