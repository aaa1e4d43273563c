"""Where the program starts on a launcher's command line, and wrapping it (pure, no I/O).

``mpswrap srun -n 4 ./app`` and ``mpswrap mpirun -np 4 ./app`` become
``srun -n 4 <wrapper> ./app``: the launcher's own options stay in front, the per-rank wrapper
goes right before the program, and the program's arguments are never looked at. Which
launchers there are is ``job.launchers``' table; this module holds each one's grammar.
Finding the program needs to know which launcher options take a value (``-n 4`` vs
``--label``); the tables below list them explicitly. ``torchrun`` runs its script with
Python itself: its workers run ``--no-python`` through the wrapper, then the interpreter
(and ``-m`` for ``--module``). Rules for what is not in a table:

- ``--opt=value`` of an unknown option: one token, fine.
- ``--opt`` of an unknown option: a flag. srun (getopt_long) also accepts a unique prefix of
  a long option (``--ntask 4``); unique prefixes of the table's names are resolved.
- an unknown short option (``-y``): a flag. srun clusters short flags (``-lu``) and takes a
  valued short option's value attached (``-n4``) or from the next token; Open MPI has no
  clusters: ``-np`` is one option and single- and double-dash spellings are the same.
- Options with an *optional* value (srun ``--exclusive[=user]``, ``-K[1]``) take it only
  attached, so they are flags here.
- ``--`` ends the options; the program follows it and keeps its ``--`` position.
- ``:`` separates MPMD segments (mpirun app contexts, srun heterogeneous steps); each
  segment's program is wrapped.
- Commands whose programs live in a file (``srun --multi-prog``, ``mpirun --app``,
  ``mpiexec -configfile``) are refused: the file, not the command line, names the programs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

from .._struct import Struct
from ..errors import UsageError
from ..jobenv import JobEnv
from .launchers import LAUNCHERS, SRUN, TORCHRUN, launcher_of

__all__ = [
    "CommandLine",
    "Segment",
    "gpus_per_node",
    "parse",
    "ranks_per_node",
    "wrap",
]

# --- srun (Slurm 20.11 - 24.x) -----------------------------------------------------------
#: Short options that need a value, with their long name.
# fmt: off
SRUN_SHORT = {
    "A": "account", "b": "begin", "B": "extra-node-info", "c": "cpus-per-task",
    "C": "constraint", "d": "dependency", "D": "chdir", "e": "error", "G": "gpus",
    "i": "input", "J": "job-name", "L": "licenses", "m": "distribution", "M": "clusters",
    "n": "ntasks", "N": "nodes", "o": "output", "p": "partition", "q": "qos",
    "r": "relative", "S": "core-spec", "t": "time", "T": "threads", "w": "nodelist",
    "W": "wait", "x": "exclude",
}
# fmt: on
#: Short options whose value is optional: only ever attached (``-K1``), else a flag.
SRUN_SHORT_OPTIONAL = frozenset("IkK")
#: Long options that need a value.
# fmt: off
SRUN_VALUED = frozenset({
    "account", "acctg-freq", "begin", "bb", "bbf", "chdir", "cluster-constraint", "clusters",
    "comment", "constraint", "container", "container-id", "core-spec", "cores-per-socket",
    "cpu-bind", "cpu_bind", "cpu-freq", "cpus-per-gpu", "cpus-per-task", "deadline", "delay-boot",
    "dependency", "distribution", "epilog", "error", "exclude", "export", "extra-node-info",
    "gid", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node", "gpus-per-socket", "gpus-per-task",
    "gres", "gres-flags", "het-group", "hint", "input", "job-name", "jobid", "licenses",
    "mail-type", "mail-user", "mcs-label", "mem", "mem-bind", "mem_bind", "mem-per-cpu",
    "mem-per-gpu", "mincpus", "mpi", "network", "nodefile", "nodelist", "nodes", "ntasks",
    "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket",
    "ntasks-per-tres", "open-mode", "output", "pack-group", "partition", "power", "prefer",
    "prolog", "profile", "qos", "relative", "reservation", "segment", "signal", "slurmd-debug",
    "sockets-per-node", "switches", "task-epilog", "task-prolog", "tasks-per-node", "thread-spec",
    "threads", "threads-per-core", "time", "time-min", "tmp", "tres-bind", "tres-per-task", "uid",
    "wait", "wckey",
})
# fmt: on
#: Long options without a value (or with an optional one, given only as ``--opt=value``);
#: listed so that unique prefixes resolve like getopt_long does.
# fmt: off
SRUN_FLAGS = frozenset({
    "bcast", "compress", "contiguous", "disable-status", "exact", "exclusive",
    "external-launcher", "help", "hold", "immediate", "kill-on-bad-exit", "label", "multi-prog",
    "nice", "no-allocate", "no-kill", "overcommit", "overlap", "oversubscribe", "preserve-env",
    "propagate", "pty", "quiet", "quit-on-interrupt", "reboot", "resv-ports", "send-libs",
    "spread-job", "test-only", "unbuffered", "usage", "use-min-nodes", "verbose", "version",
    "whole", "x11",
})
# fmt: on

# --- Open MPI mpirun/mpiexec/orterun 4.x and 5.x (and MPICH Hydra where they agree) -------
#: name -> (canonical name, number of values). ``-x VAR`` takes one, ``--mca a b`` two.
# fmt: off
_OMPI_TABLE: dict[str, tuple[str, int]] = {
    **dict.fromkeys(("np", "n", "c"), ("np", 1)),
    **dict.fromkeys(("H", "host", "hosts"), ("host", 1)),
    **dict.fromkeys(("hostfile", "machinefile", "f", "default-hostfile"), ("hostfile", 1)),
    **dict.fromkeys(("rankfile", "rf"), ("rankfile", 1)),
    **dict.fromkeys(("npernode", "N", "ppn"), ("npernode", 1)),
    **dict.fromkeys(("wdir", "wd"), ("wdir", 1)),
    **dict.fromkeys(("cpus-per-proc", "cpus-per-rank"), ("cpus-per-proc", 1)),
    **dict.fromkeys(("cartofile", "cf"), ("cartofile", 1)),
    **{n: (n, 1) for n in (
        "am", "bind-to", "cpu-list", "cpu-set", "debugger", "display", "hnp", "keepalive",
        "launch-agent", "map-by", "max-restarts", "max-vm-size", "npersocket", "ompi-server",
        "output", "output-filename", "path", "personality", "pmixam", "ppr", "prefix",
        "preload-files", "rank-by", "report-events", "report-pid", "report-uri",
        "runtime-options", "stdin", "timeout", "tune", "x", "xml-file", "xterm", "genvlist",
        "envlist", "launcher", "bootstrap", "iface",
    )},
    **{n: (n, 2) for n in ("mca", "gmca", "pmixmca", "prtemca", "genv", "env")},
}
# fmt: on
#: Programs named in a file instead of on the command line.
REFUSED = {
    "multi-prog": "srun --multi-prog takes the programs from its configuration file",
    "app": "mpirun --app takes the programs from its appfile",
    "configfile": "mpiexec -configfile takes the programs from its file",
}
_REFUSED_HINT = (
    "put mpswrap in front of each program inside that file (e.g. '0-3 mpswrap ./app'), "
    "and run the launcher without the mpswrap prefix"
)

# --- torchrun (PyTorch 2.x torch.distributed.run) ----------------------------------------
#: Options that take a value (either spelling: ``--nproc-per-node``, ``--nproc_per_node``).
# fmt: off
TORCHRUN_VALUED = frozenset({
    "nnodes", "nproc-per-node", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf",
    "max-restarts", "monitor-interval", "start-method", "role", "log-dir", "logs-specs",
    "redirects", "tee", "local-ranks-filter", "node-rank", "master-addr", "master-port",
    "local-addr", "event-log-handler", "numa-binding", "signals-to-handle",
    "local_addr", "r", "t",
})
# fmt: on


class Segment(Struct, frozen=True):
    """One MPMD segment: launcher tokens as written, their parsed options, the program."""

    tokens: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    dashdash: bool
    program: tuple[str, ...]

    def values(self, name: str) -> list[str]:
        """Every value given to option ``name`` (canonical spelling), first value of each."""
        return [vals[0] for opt, vals in self.options if opt == name and vals]

    def last(self, name: str) -> str | None:
        found = self.values(name)
        return found[-1] if found else None

    def argv(self, wrapper: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
        head = [*extra, *self.tokens, *(["--"] if self.dashdash else [])]
        return [*head, *(wrapper if self.program else ()), *self.program]


class CommandLine(Struct, frozen=True):
    """A parsed launcher command line."""

    launcher: str
    family: str
    segments: tuple[Segment, ...]

    def argv(self, wrapper: Sequence[str] = (), extra: Sequence[str] = ()) -> list[str]:
        """The command with ``wrapper`` before each program and ``extra`` options first in
        each segment (e.g. ``-x MPSWRAP_JOB`` so every app context exports it)."""
        out = [self.launcher]
        for index, segment in enumerate(self.segments):
            if index:
                out.append(":")
            out += segment.argv(wrapper, extra)
        return out


def parse(argv: Sequence[str], python: str = "python3") -> CommandLine:
    """Parse ``argv`` (launcher name first); UsageError for unknown launchers or bad usage.
    ``python``: the interpreter a torchrun's workers run their script with."""
    if not argv:
        raise UsageError("no launcher given")
    row = launcher_of(argv[0])
    if row is None:
        names = ", ".join(n for r in LAUNCHERS for n in r.names[:3])
        raise UsageError("not a launcher mpswrap knows", thing=argv[0], hint=f"use {names}")
    if row is TORCHRUN:
        return CommandLine(argv[0], row.family, (_torchrun_segment(list(argv[1:]), python),))
    parse_segment = _srun_segment if row is SRUN else _ompi_segment
    segments = tuple(parse_segment(part, argv[0]) for part in _split(list(argv[1:])))
    return CommandLine(argv[0], row.family, segments)


def wrap(argv: Sequence[str], wrapper: Sequence[str]) -> list[str]:
    """``argv`` with ``wrapper`` inserted before the program of every segment."""
    return parse(argv).argv(wrapper)


def _split(tokens: list[str]) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for token in tokens:
        if token == ":":  # noqa: S105 (an MPMD separator, not a password)
            parts.append([])
        else:
            parts[-1].append(token)
    return parts


class _Builder:
    """Collects one segment's options while walking its tokens."""

    def __init__(self, tokens: list[str], launcher: str) -> None:
        self.tokens = tokens
        self.launcher = os.path.basename(launcher)
        self.options: list[tuple[str, tuple[str, ...]]] = []
        self.pos = 0

    def take(self, count: int, option: str) -> tuple[str, ...]:
        """The next ``count`` tokens as the values of ``option``."""
        values = tuple(self.tokens[self.pos : self.pos + count])
        if len(values) < count:
            raise UsageError(
                f"{self.launcher} option {option} needs {count} value(s)",
                thing=" ".join(self.tokens),
            )
        self.pos += count
        return values

    def add(self, name: str, values: tuple[str, ...]) -> None:
        if name in REFUSED:
            raise UsageError(
                f"cannot wrap {self.launcher} --{name}", cause=REFUSED[name], hint=_REFUSED_HINT
            )
        self.options.append((name, values))

    def done(self) -> Segment:
        rest = self.tokens[self.pos :]
        dashdash = bool(rest) and rest[0] == "--"
        program = tuple(rest[1:] if dashdash else rest)
        consumed = tuple(self.tokens[: self.pos])
        return Segment(consumed, tuple(self.options), dashdash, program)


def _is_option(token: str) -> bool:
    return token.startswith("-") and token not in ("-", "--")


def _srun_segment(tokens: list[str], launcher: str) -> Segment:
    build = _Builder(tokens, launcher)
    while build.pos < len(tokens) and _is_option(tokens[build.pos]):
        token = tokens[build.pos]
        build.pos += 1
        if token.startswith("--"):
            _srun_long(build, token)
        else:
            _srun_short(build, token)
    return build.done()


def _srun_long(build: _Builder, token: str) -> None:
    given, eq, value = token[2:].partition("=")
    name, valued = _resolve_prefix(given)
    if eq:
        build.add(name, (value,))
    else:
        build.add(name, build.take(1, token) if valued else ())


def _resolve_prefix(given: str) -> tuple[str, bool]:
    """(name, takes a value): getopt_long also accepts a prefix of a long option's name.

    An ambiguous prefix is an error for srun itself; here it takes a value when every
    option it could mean does, so the program is still found where srun would look.
    """
    if given in SRUN_VALUED or given in SRUN_FLAGS:
        return given, given in SRUN_VALUED
    valued = [n for n in SRUN_VALUED if n.startswith(given)]
    flags = [n for n in SRUN_FLAGS if n.startswith(given)]
    if len(valued) + len(flags) == 1:
        return (valued or flags)[0], bool(valued)
    return given, bool(valued) and not flags


def _srun_short(build: _Builder, token: str) -> None:
    """A getopt cluster: flags, then at most one option whose value is the rest or next."""
    for index, letter in enumerate(token[1:], start=2):
        rest = token[index:]
        if letter in SRUN_SHORT:
            value = (rest,) if rest else build.take(1, f"-{letter}")
            build.add(SRUN_SHORT[letter], value)
            return
        if letter in SRUN_SHORT_OPTIONAL:
            build.add(letter, (rest,) if rest else ())
            return
        build.add(letter, ())


def _ompi_segment(tokens: list[str], launcher: str) -> Segment:
    build = _Builder(tokens, launcher)
    while build.pos < len(tokens) and _is_option(tokens[build.pos]):
        token = tokens[build.pos]
        build.pos += 1
        given, eq, value = token.lstrip("-").partition("=")
        name, count = _OMPI_TABLE.get(given, (given, 0))
        if eq:  # Open MPI 4 rejects "--np=2"; 5 accepts it. Either way it is one token.
            build.add(name, (value, *build.take(max(0, count - 1), token)))
        else:
            build.add(name, build.take(count, token))
    return build.done()


def _torchrun_segment(tokens: list[str], python: str) -> Segment:
    """torchrun's options, then its script: the tokens as torchrun gets them once its workers
    run the wrapper (``--no-python`` added, ``-m``/``--module`` moved to the program)."""
    build = _Builder(tokens, "torchrun")
    module = no_python = False
    while build.pos < len(tokens) and _is_option(tokens[build.pos]):
        token = tokens[build.pos]
        build.pos += 1
        given, eq, value = token.lstrip("-").partition("=")
        name = given.replace("_", "-")
        if name in ("m", "module"):
            module = True
        elif name in ("no-python",):
            no_python = True
        elif eq:
            build.add(name, (value,))
        elif name in TORCHRUN_VALUED:
            build.add(name, build.take(1, token))
        else:
            build.add(name, ())
    found = build.done()
    kept = tuple(t for t in found.tokens if t.lstrip("-") not in ("m", "module"))
    head = () if no_python else (python, *(["-m"] if module else []))
    return Segment(
        (*kept, *(() if no_python else ("--no-python",))),
        found.options,
        found.dashdash,
        (*head, *found.program),
    )


# --- ranks per node (capacity check before launch) ---------------------------------------
def ranks_per_node(line: CommandLine, env: Mapping[str, str]) -> int | None:
    """The fewest ranks some node must get, when the command line says; else None.

    A lower bound on purpose: the capacity check refuses only what is certain to fail.
    ``env`` supplies Slurm's defaults (``SLURM_NNODES`` inside an allocation).
    """
    if line.family == SRUN.family:
        counts = [_srun_per_node(s, env) for s in line.segments if s.program]
        known = [c for c in counts if c is not None]
        return max(known) if known else None
    if line.family == TORCHRUN.family:
        return _int(line.segments[0].last("nproc-per-node"))
    return _ompi_per_node(line.segments, env)


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    head = text.split("(")[0].split(",")[0]
    return int(head) if head.isascii() and head.isdigit() else None


def _srun_per_node(seg: Segment, env: Mapping[str, str]) -> int | None:
    per_node = _int(seg.last("ntasks-per-node") or seg.last("tasks-per-node"))
    if per_node is not None:
        return per_node
    job = JobEnv(env)
    ntasks = _int(seg.last("ntasks")) or _int(job.ntasks_text)
    nodes_text = seg.last("nodes") or job.nodes_text
    if ntasks is None or nodes_text is None:
        return None
    most_nodes = _int(nodes_text.split("-")[-1].split(":")[0])
    return math.ceil(ntasks / most_nodes) if most_nodes else None


def _ompi_nodes(segments: Sequence[Segment], env: Mapping[str, str]) -> int | None:
    hosts = {h.split(":")[0] for s in segments for v in s.values("host") for h in v.split(",")}
    if hosts:
        return len(hosts)
    if any(s.values("hostfile") or s.values("rankfile") for s in segments):
        return None
    job = JobEnv(env)
    if job.job_id and job.nodes_text:
        return _int(job.nodes_text)
    return 1  # no hosts, no allocation: every rank runs here


def _ompi_per_node(segments: Sequence[Segment], env: Mapping[str, str]) -> int | None:
    nodes = _ompi_nodes(segments, env)
    total = 0
    for seg in (s for s in segments if s.program):
        per_node = _int(seg.last("npernode")) or _ppr_per_node(seg)
        count = _int(seg.last("np"))
        if per_node is None and count is not None and nodes:
            per_node = math.ceil(count / nodes)
        if per_node is None:
            return None
        total += per_node
    return total or None


def _ppr_per_node(seg: Segment) -> int | None:
    """``--map-by ppr:N:node`` or ``--ppr N:node``."""
    for text in (*seg.values("map-by"), *(f"ppr:{v}" for v in seg.values("ppr"))):
        parts = text.split(":")
        if len(parts) >= 3 and parts[0] == "ppr" and parts[2].startswith("node"):
            return _int(parts[1])
    return None


def gpus_per_node(line: CommandLine) -> int | None:
    """GPUs per node an srun asks for (``--gres=gpu[:type]:N``, ``--gpus-per-node=[type:]N``)."""
    for seg in line.segments:
        for text in seg.values("gres"):
            for item in text.split(","):
                parts = item.split(":")
                if parts[0] == "gpu" and len(parts) > 1 and parts[-1].isdigit():
                    return int(parts[-1])
        per_node = (seg.last("gpus-per-node") or "").split(":")[-1]
        if per_node.isdigit():
            return int(per_node)
    return None
