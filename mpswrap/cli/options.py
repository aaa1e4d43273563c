"""What the command line accepts, as tables: the launch options, the output options, the
modes. ``cli.main`` builds its one parser from them; docs/reference.md is generated from that
parser."""

from __future__ import annotations

import os
from collections.abc import Callable

from .. import __version__, values
from ..errors import MpswrapError
from ..job import launchers
from ..paths import validate_name

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any, TypeVar

    T = TypeVar("T")

__all__ = [
    "CALIBRATE_OPTIONS",
    "FARM_OPTIONS",
    "FARM_STATUS_OPTIONS",
    "LAUNCHERS",
    "MODES",
    "RUN_OPTIONS",
    "VERBOSITY",
    "WRAPPER_OPTIONS",
    "Options",
    "add",
    "counts",
    "cpu_list",
    "given",
    "gpu_list",
    "halt",
    "job_id",
    "k_or_auto",
    "mem_default",
    "node_name",
    "path",
    "seconds",
    "share",
    "thread_percent",
    "threads",
    "whole",
]


# --- values: what an option accepts, checked as it is parsed (a bad one exits 2, naming it) --
def _refused(message: str) -> Exception:
    """The parser's error for a bad value: ``argument FLAG: message``. argparse is imported
    here, not at the top: the hooks read the command table, which reads this module, and load
    no parser."""
    import argparse

    return argparse.ArgumentTypeError(message)


def seconds(
    minimum: float = 0.0, *, above: bool = True, most: float = values.YEAR
) -> Callable[[str], float]:
    """Seconds, a plain decimal above ``minimum`` (or at least it, ``above=False``) and at
    most ``most`` (a year unless said)."""
    return _checked(lambda text: values.within(text, minimum, most, "seconds", above=above))


def whole(minimum: int) -> Callable[[str], int]:
    """A whole number from ``minimum`` to ``values.MOST``."""
    return _checked(lambda text: values.whole(text, minimum))


def _checked(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` (a parser of ``values``) as an option's type: its ValueError is the
    parser's error, naming the option."""

    def checked(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:  # a UsageError too: its cause says what was expected
            reason = exc.cause if isinstance(exc, MpswrapError) else exc
            raise _refused(f"invalid value {text!r}: {reason}") from None

    return checked


def _kept(parse: Callable[[str], object]) -> Callable[[str], str]:
    """``parse`` as a check only: the option keeps its text, which is read again where it is
    used (a setting's loader, the farm's)."""

    def keep(text: str) -> str:
        parse(text)
        return text

    return _checked(keep)


#: ``--per-gpu``: ``auto`` (None: found as the farm runs) or a whole number, 1 or more.
k_or_auto = _checked(values.per_gpu)


def _name(kind: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return validate_name(kind, text)
        except MpswrapError as exc:
            raise _refused(f"invalid value {text!r}: {exc.cause}") from None

    return parse


#: A job id or a node name: one safe path component.
job_id, node_name = _name("job id"), _name("node name")


def given(expected: str) -> Callable[[str], str]:
    """An option's text, refused when empty: an empty value would silently mean the default
    (the default directory, every GPU, every CPU, no module)."""

    def parse(text: str) -> str:
        if not text:
            raise _refused(f"invalid value '': expected {expected}")
        return text

    return parse


#: A file or directory name.
path = given("a path")


def run_dir(text: str) -> str:
    """``--run-dir``: made absolute from the current directory, as the daemons' variables and
    every later command must name it from anywhere; something there that is no directory (a
    file, a FIFO) is refused as it is given."""
    where = os.path.abspath(path(text))
    if os.path.lexists(where) and not os.path.isdir(where):
        raise _refused(f"invalid value {text!r}: expected a directory")
    return where


_GPUS = "all, GPU indices like 0,2-3 or GPU UUIDs"


def gpu_list(text: str) -> str:
    """A GPU list: ``all``, NVML indices or UUIDs, its form checked here (a bad one names
    ``--gpus``), the GPUs themselves against the node's later (``mps.gpu.resolve_gpus``)."""
    from ..jobenv import UUID_RE, parse_int_list  # not for the hooks, which parse no option

    given(_GPUS)(text)
    if text.strip() == "all":
        return text
    for item in (part.strip() for part in text.split(",")):
        try:
            is_uuid = item.upper().startswith(("GPU-", "MIG-"))
            if (is_uuid and not UUID_RE.fullmatch(item)) or (
                not is_uuid and not parse_int_list(item, "GPU list")
            ):
                raise ValueError(item)
        except (ValueError, MpswrapError):
            raise _refused(f"invalid value {text!r}: expected {_GPUS}") from None
    return text


def _halt(text: str) -> object:
    from ..taskfarm.controls import parse_halt  # not for the hooks, which parse no option

    return parse_halt(text)


def _share(text: str) -> object:
    from ..taskfarm.tasks import parse_share  # not for the hooks, which parse no option

    return parse_share(text)


def _percent_or_none(text: str) -> object:
    if not text or text.lower() not in ("none", "off"):
        try:
            return values.percent(text)
        except ValueError:
            raise ValueError("expected a percentage in (0, 100] or none") from None
    return None


#: ``--threads`` of a run, and ``start --threads`` (a default for every client).
threads, thread_percent = _kept(values.threads), _kept(_percent_or_none)
#: ``farm --halt`` and ``--share``; ``calibrate --counts`` (a sorted list).
halt, share, counts = _kept(_halt), _kept(_share), _checked(values.counts)


def _cpus(text: str) -> object:
    from ..jobenv import parse_int_list  # not for the hooks, which parse no option

    if not text:
        raise ValueError("expected CPU numbers like 0,2-3")
    return parse_int_list(text, "--cpus")


#: ``start --cpus``: CPU numbers, their form checked here (the CPUs against this process's
#: later).
cpu_list = _kept(_cpus)

#: ``start --mem-limit``: a size, or none.
mem_default = _checked(values.mem_default)


Options = tuple[tuple[tuple[str, ...], dict[str, "Any"]], ...]
#: The wrapper options: before a launcher or program, and in ``run`` (written once).
# fmt: off
WRAPPER_OPTIONS: Options = (
    (("--gpus",), {"metavar": "LIST", "type": gpu_list, "help": "GPUs to use: 'all', NVML "
                   "indices or UUIDs (default: the step's GPUs, else all)"}),
    (("--policy",), {"choices": ("block", "cyclic", "affinity"),
                     "help": "rank to GPU mapping: consecutive ranks share a GPU (block), "
                     "take turns (cyclic) or go to GPUs near their CPUs (affinity) "
                     "(default: the gpu_policy setting, block)"}),
    (("--threads",), {"metavar": "SPEC", "type": threads,
                      "help": "active thread %%: none, uniform, oversubscribe, a percent, "
                      "or weights w1:w2:... "
                      "(default: the active_thread_percentage setting, none)"}),
    (("--mem-limit",), {"metavar": "SIZE", "type": _checked(values.mem_limit),
                        "help": "pinned device memory per client: auto (GPU memory / ranks "
                        "on it) or e.g. 8G, 512M (default: the pinned_mem_limit setting, none)"}),
    (("--priority",), {"type": _checked(values.priority), "choices": (0, 1),
                       "help": "client priority, 1 = below normal "
                       "(default: the client_priority setting, none)"}),
    (("--verify-attach",), {"choices": ("warn", "fail", "off"),
                            "help": "a rank that is not an MPS client: warn, fail (exit 69) or "
                            "off (default: the verify_attach setting, warn)"}),
    (("--verify-timeout",), {"type": seconds(), "default": 30.0, "metavar": "S",
                             "help": "seconds to wait for attachment (default: 30)"}),
    (("--no-shield",), {"action": "store_true",
                        "help": "let TERM/INT/HUP reach the program before its clients are "
                        "ended through MPS (howto-users.md, Signals)"}),
    (("--grace",), {"type": _checked(values.grace), "metavar": "S",
                    "help": "seconds from signal to SIGKILL "
                    "(default: the kill_grace setting, 10)"}),
    (("--dry-run",), {"action": "store_true",
                      "help": "print what would run (or refuse as the run would); start nothing"}),
    (("--job",), {"metavar": "ID", "type": job_id,
                  "help": "job id for the per-job state (default: Slurm's)"}),
    (("--gpus-per-rank",), {"type": whole(1), "metavar": "N",
                            "help": "GPUs each rank uses (a JAX process, model parallelism): "
                            "the GPUs taken N at a time, one MPS daemon over each group, "
                            "whose ranks see its N GPUs (default: 1)"}),
)
#: Output options, accepted before and after a command word (--version too: anywhere among
#: mpswrap's own options it prints the version, as git's and parallel's).
VERBOSITY: Options = (
    (("--version",), {"action": "version", "version": f"mpswrap {__version__}",
                      "help": "print the version and exit"}),
    (("-v", "--verbose"), {"action": "count", "default": 0,
                           "help": "more log lines (debug); overrides log_level"}),
    (("-q", "--quiet"), {"action": "count", "default": 0,
                         "help": "warnings and errors only (-qq: errors only)"}),
    (("--debug",), {"action": "store_true", "default": False,
                    "help": "debug logs, and tracebacks for internal errors"}),
)
# fmt: on
RUN_OPTIONS: Options = (
    (
        ("-n", "--np"),
        {
            "type": whole(1),
            "required": True,
            "dest": "nprocs",
            "metavar": "N",
            "help": "ranks to start (required)",
        },
    ),
)
# fmt: off
#: ``mpswrap farm``'s own options (docs/howto-farm.md).
FARM_OPTIONS: Options = (
    (("--per-gpu",), {"type": k_or_auto, "metavar": "auto|K", "help": "tasks at once on each "
                      "GPU; auto: found as the farm runs, by throughput and GPU memory "
                      "(default: auto)"}),
    (("--retries",), {"type": whole(0), "default": 0, "metavar": "N",
                      "help": "runs a task that fails up to N more times, whatever the way, "
                      "where parallel's --retries N is N runs in all; a task a fatal GPU fault "
                      "ended runs again at least once, one that ran out of GPU memory up to 3 "
                      "times in all (default: 0)"}),
    (("--timeout",), {"type": seconds(), "metavar": "S", "help": "seconds a task may run: "
                      "then it is ended through MPS terminate_client, then a signal, and "
                      "recorded as timed out (default: no limit)"}),
    (("--halt",), {"metavar": "WHEN", "default": "never", "type": halt,
                   "help": "stop after failures, as GNU parallel: soon,fail=N (no new "
                   "task once N failed), now,fail=N (the running ones ended too); N or P%% "
                   "of the tasks (soon,fail=10%%); success=N counts the tasks done, done=N "
                   "both (default: never)"}),
    (("--skip-failed",), {"action": "store_true", "help": "run again: tasks that failed in "
                          "the directory before are not run again, and keep the exit code 1 "
                          "(default: they are run)"}),
    (("--heartbeat",), {"type": seconds(0, above=False), "default": 60.0, "metavar": "S",
                        "help": "without a terminal, a line of where the farm stands after S "
                        "seconds without one; 0: none (default: 60)"}),
    (("--dir",), {"dest": "farm_dir", "metavar": "DIR", "type": path, "help": "logs and state "
                  "(default: <TASKS>.farm here); running again skips tasks done there"}),
    (("--share",), {"metavar": "I/N", "type": share,
                    "help": "run tasks I, I+N, I+2N, ... (default: this srun task's "
                    "share, SLURM_PROCID of the step's tasks; else all)"}),
    (("--progress",), {"choices": ("auto", "bar", "lines", "off"), "default": "auto",
                       "help": "a redrawn line (bar), a line per task (lines) or none; "
                       "auto: bar on a terminal (default: auto)"}),
    (("--tag",), {"action": "store_true",
                  "help": "show each task's output live, whole lines, each prefixed by "
                  "the task's number and a tab (stdout to stdout, stderr to stderr), as "
                  "parallel --tag --line-buffer; the logs are written as without it"}),
)
#: ``mpswrap farm status``'s options.
FARM_STATUS_OPTIONS: Options = (
    (("--json",), {"action": "store_true", "help": "print it as JSON"}),
    (("--failed",), {"action": "store_true", "help": "only the failed tasks, one a line "
                     "(code, command, log)"}),
    (("--plot",), {"metavar": "FILE", "type": path, "help": "also save K per GPU and "
                   "throughput over time (matplotlib) (default: none)"}),
)
#: ``mpswrap calibrate``'s own options.
CALIBRATE_OPTIONS: Options = (
    (("--max",), {"type": whole(1), "dest": "top", "metavar": "N", "help": "most copies at once "
                  "(default: the client limit, a CPU per copy, at most 16)"}),
    (("--counts",), {"metavar": "LIST", "type": counts, "help": "copies to try, e.g. 1,4,8,12 "
                     "(default: 1, 2, 4, ... up to --max)"}),
    (("--repeats",), {"type": whole(1), "default": 2, "metavar": "R",
                      "help": "runs of each configuration, interleaved (default: 2)"}),
    (("--plot",), {"metavar": "FILE", "type": path,
                   "help": "save throughput against copies (matplotlib) (default: none)"}),
    (("--json",), {"action": "store_true", "help": "print the table as JSON"}),
    (("--dir",), {"dest": "farm_dir", "default": "calibrate.farm", "metavar": "DIR",
                  "type": path,
                  "help": "where the copies' logs go, kept when one fails "
                  "(default: calibrate.farm)"}),
)
# fmt: on


#: The launchers' command names, from the launcher table (``job.launchers``).
LAUNCHERS = tuple(name for row in launchers.LAUNCHERS for name in row.names)

MODES = f"""\
Run many CUDA processes per GPU through NVIDIA MPS, on Slurm or alone.

modes:
  mpswrap [options] {"|".join(LAUNCHERS)} ...
                        prefix a launcher: every rank it starts is wrapped
                        (mpswrap srun -n 8 ./app, mpswrap mpirun -np 8 ./app,
                        mpswrap torchrun --nproc-per-node 8 train.py)
  mpswrap [options] [--] PROGRAM ...
                        per-rank: this process's rank of a launch becomes an MPS
                        client (srun mpswrap ./app); after -- always a program
  mpswrap run -n N [options] -- PROGRAM ...
                        N ranks on this node, no scheduler
  mpswrap farm [options] TASKS
                        many independent commands, K at a time per GPU
  mpswrap calibrate [options] -- PROGRAM ...
                        how many copies per GPU, with which thread policy
  mpswrap COMMAND ...   manage daemons, show settings, the Slurm hooks (below)"""


def add(parser: Any, options: Options) -> None:
    """Add an options table to ``parser`` (or an argument group of it)."""
    for flags, kwargs in options:
        parser.add_argument(*flags, **kwargs)
