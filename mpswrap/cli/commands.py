"""The one table of commands: each command's name, what it says about itself, the arguments
it takes and the function that runs it. Every entrance goes through it: the ``mpswrap``
command (``cli.main``), the hooks' fast path (``python -I -m mpswrap prolog``) and
``python -m mpswrap.slurm``; the parser, ``help``, the man page, bash completion and
docs/reference.md are built from it.

A command's function is named as ``module:function`` and imported when it runs, so that
reading the table costs a rank or a hook nothing. Building a command's arguments imports
argparse; reading the table does not.
"""

from __future__ import annotations

import importlib

from .._struct import Struct
from .options import (
    WRAPPER_OPTIONS,
    cpu_list,
    given,
    gpu_list,
    job_id,
    mem_default,
    node_name,
    path,
    run_dir,
    seconds,
    thread_percent,
    whole,
)

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import Any

__all__ = ["COMMANDS", "HOOKS", "Command", "build", "command_named", "invoke", "words_of"]


class Command(Struct, frozen=True):
    """One command of the table."""

    name: str  # one word, or two for a command of a command (``farm status``)
    summary: str  # its line in ``mpswrap help``
    description: str
    examples: tuple[str, str]
    run: str  # ``module:function`` (under mpswrap), called with the parsed arguments
    #: The exit codes it gives (``errors.EXIT_CODES``; a launched program's own pass through).
    exits: tuple[str, ...]
    #: Adds the command's own arguments to its parser (none: it takes none).
    arguments: Callable[[Any], None] | None = None
    #: The launch options (``WRAPPER_OPTIONS``) it takes, before or after its word.
    launch: tuple[str, ...] = ()
    config: bool = True  # it takes --config FILE
    program: bool = False  # ``-- PROGRAM ...`` follows its options (run, calibrate)
    usage: str | None = None

    def function(self) -> Callable[[Any], int]:
        module, name = self.run.split(":")
        return getattr(importlib.import_module(f"mpswrap.{module}"), name)  # type: ignore[no-any-return]


def invoke(name: str, args: Any) -> int:
    """Run the command ``name`` with its parsed arguments: its exit code."""
    return command_named(name).function()(args)


def command_named(name: str) -> Command:
    return _BY_NAME[name]


# --- the commands' own arguments ------------------------------------------------------------
def _json(parser: Any, text: str = "machine-readable output") -> None:
    parser.add_argument("--json", action="store_true", help=text)


def _job(parser: Any) -> None:
    parser.add_argument(
        "--job",
        metavar="ID",
        type=job_id,
        help="job id (default: Slurm's; else every job of yours here)",
    )
    parser.add_argument(
        "--node", metavar="NAME", type=node_name, help="node name (default: this node)"
    )
    parser.add_argument(
        "--run-dir",
        metavar="DIR",
        type=run_dir,
        help="state directory to use (default: the run_dir setting as root, else user_run_dir)",
    )


def _every_job(parser: Any) -> None:
    parser.add_argument(
        "--all",
        action="store_true",
        help="every job here (root: every user's), even inside a job",
    )


def _start(parser: Any) -> None:
    _job(parser)
    parser.add_argument(
        "--gpus",
        metavar="LIST",
        default="all",
        type=gpu_list,
        help="'all', NVML indices (0,2-3) or UUIDs (default: all)",
    )
    parser.add_argument(
        "--user",
        type=given("a user name"),
        help="run the daemons as this user, root only (default: you)",
    )
    parser.add_argument(
        "--cpus",
        metavar="LIST",
        type=cpu_list,
        help="CPUs the daemons may use, intersected with GPU-local CPUs "
        "(default: every CPU this process may use)",
    )
    parser.add_argument(
        "--threads",
        metavar="PERCENT",
        type=thread_percent,
        help="default active thread percentage (default: the active_thread_percentage "
        "setting, none)",
    )
    parser.add_argument(
        "--mem-limit",
        metavar="SIZE",
        type=mem_default,
        help="default pinned device memory limit, e.g. 8G (default: the pinned_mem_limit "
        "setting, none)",
    )
    parser.add_argument(
        "--priority",
        choices=("0", "1"),
        help="default client priority (default: the client_priority setting, none)",
    )
    parser.add_argument("--prestart", action="store_true", help="start the MPS server now")
    _json(parser, "print the manifests as JSON")


def _stop(parser: Any) -> None:
    _job(parser)
    _json(parser)


def _status(parser: Any) -> None:
    _stop(parser)
    parser.add_argument(
        "--watch",
        nargs="?",
        type=seconds(),
        const=2.0,
        metavar="S",
        help="print it again every S seconds (2 when S is not given) until a signal ends it "
        "(exit 128+N: 130 for ^C) (default: once)",
    )
    _every_job(parser)


def _metrics(parser: Any) -> None:
    _job(parser)
    _every_job(parser)
    parser.add_argument(
        "--textfile",
        metavar="DIR",
        type=path,
        help="write DIR/mpswrap.prom, for node_exporter's textfile collector (default: print "
        "to standard output)",
    )
    parser.add_argument(
        "--process-labels",
        action="store_true",
        help="one series per client process, with its pid (and command in "
        "mpswrap_client_info): a new series for every process, so off by default",
    )


def _report(parser: Any) -> None:
    parser.add_argument("job_id", metavar="JOB", type=job_id, help="the job id (required)")
    _json(parser)


def _demo(parser: Any) -> None:
    parser.add_argument(
        "--clients",
        type=whole(1),
        default=4,
        metavar="N",
        help="number of clients, at most the GPUs' MPS client limits (default: 4)",
    )
    parser.add_argument(
        "--simulate",
        choices=("auto", "yes", "no"),
        default="auto",
        help="use the built-in MPS simulator; auto: when no GPU/MPS is found (default: auto)",
    )


def _run(parser: Any) -> None:
    from .options import RUN_OPTIONS, add

    add(parser, RUN_OPTIONS)


def _farm(parser: Any) -> None:
    from .options import FARM_OPTIONS, add, path

    add(parser, FARM_OPTIONS)
    parser.add_argument(
        "tasks",
        metavar="TASKS",
        type=path,
        help="a file with one command per line, or - for standard input",
    )


def _farm_status(parser: Any) -> None:
    from .options import FARM_STATUS_OPTIONS, add

    add(parser, FARM_STATUS_OPTIONS)
    parser.add_argument(
        "farm_dir",
        nargs="?",
        metavar="DIR",
        type=path,
        help="the farm's directory, or its task list (default: every *.farm here)",
    )


def _calibrate(parser: Any) -> None:
    from .options import CALIBRATE_OPTIONS, add

    add(parser, CALIBRATE_OPTIONS)


def _container_args(parser: Any) -> None:
    from ..job.containers import PROGRAMS

    parser.add_argument(
        "runtime",
        metavar="RUNTIME",
        choices=PROGRAMS,
        help=f"{', '.join(PROGRAMS[:-1])} or {PROGRAMS[-1]}",
    )
    parser.add_argument(
        "--job",
        metavar="ID",
        type=job_id,
        help="the job whose daemons to bind (default: the launcher's or Slurm's; outside a job, "
        "every job mpswrap run starts for you here)",
    )


def _install(parser: Any) -> None:
    from ..slurm.install import add_install_arguments

    add_install_arguments(parser, path)


def _uninstall(parser: Any) -> None:
    from ..slurm.install import add_uninstall_arguments

    add_uninstall_arguments(parser, path)


def _sim(parser: Any) -> None:
    from .simcmd import add_arguments

    add_arguments(parser)


def _completion(parser: Any) -> None:
    parser.add_argument(
        "shell",
        nargs="?",
        metavar="SHELL",
        choices=("bash",),
        default="bash",
        help="the shell: bash (default: bash)",
    )


def _help(parser: Any) -> None:
    parser.add_argument(
        "topic", nargs="*", metavar="COMMAND", help="the command to explain (default: all)"
    )
    parser.add_argument(
        "--man-path", action="store_true", help="print where the man page mpswrap(1) is"
    )


#: What a farm and calibrate take of the launch options: not --policy (a farm places each
#: task on the next free seat; calibrate runs on one GPU), nor --gpus-per-rank (one GPU a task).
_LAUNCH = tuple(f for flags, _ in WRAPPER_OPTIONS for f in flags)
_FARM_LAUNCH = tuple(f for f in _LAUNCH if f not in ("--policy", "--gpus-per-rank"))
_CALIBRATE_LAUNCH = ("--gpus", "--mem-limit", "--priority", "--grace", "--dry-run", "--job")

_HOOK = "Run by slurmd through the shim install-hooks writes, not by hand."
#: A hook's exit code keeps its contract with slurmd (slurm/README.md, Exit codes): a task
#: prolog never fails a task.
_HOOK_EXITS = ("0", "1")

#: Every command, in the order ``mpswrap help`` lists them.
COMMANDS: tuple[Command, ...] = (
    Command(
        "run",
        "run N ranks of a command on this node: run -n N -- CMD",
        "Run N ranks of a program on this node without a scheduler: one MPS daemon per GPU "
        "used, the ranks placed by --policy, each an MPS client; exit code of the first rank "
        "that fails.",
        ("mpswrap run -n 4 -- python train.py", "mpswrap run -n 8 --gpus 0,1 -- ./app"),
        "entry.local:cli",
        ("0", "1", "2", "69", "126", "127", "128+N"),
        _run,
        launch=_LAUNCH,
        config=False,
        program=True,
        usage="mpswrap run -n N [options] -- PROGRAM ...",
    ),
    Command(
        "farm",
        "run many independent commands, K at a time per GPU",
        "Run many independent commands, one a line of TASKS, K at a time on each GPU. Logs "
        "and state go to --dir; running it again skips the tasks already done there. "
        "'mpswrap farm status [DIR]' tells, from any shell, how a farm is doing.",
        ("mpswrap farm --per-gpu 8 --dir results tasks.txt", "mpswrap farm status results"),
        "cli.farmcmd:cmd_farm",
        ("0", "1", "2", "128+N"),
        _farm,
        launch=_FARM_LAUNCH,
        config=False,
        usage="mpswrap farm [options] TASKS",
    ),
    Command(
        "farm status",
        "how a farm is doing, from any shell",
        "Show how the farm of DIR (a farm directory or its task list; default: every *.farm "
        "here) is doing: tasks done, failed, running and left, K per GPU, throughput, and "
        "which tasks failed. It reads the farm's journal only, while the farm runs or after.",
        ("mpswrap farm status results", "mpswrap farm status --json tasks.txt"),
        "cli.farmcmd:cmd_farm_status",
        ("0", "2"),
        _farm_status,
        config=False,
    ),
    Command(
        "calibrate",
        "how many copies per GPU, with which thread policy",
        "Time 1, 2, 4, ... copies of a program on one GPU, time-sliced and under MPS, and "
        "recommend the copies per GPU (farm --per-gpu) and the --threads policy.",
        ("mpswrap calibrate -- python step.py", "mpswrap calibrate --counts 1,4,8 -- ./app"),
        "cli.farmcmd:cmd_calibrate",
        ("0", "1", "2", "126", "127"),
        _calibrate,
        launch=_CALIBRATE_LAUNCH,
        config=False,
        program=True,
        usage="mpswrap calibrate [options] -- PROGRAM ...",
    ),
    Command(
        "start",
        "start one MPS daemon per GPU (user mode or as root)",
        "Start one MPS control daemon per GPU, as you (user mode) or, as root, for another "
        "user. Prints each daemon and the CUDA_MPS_PIPE_DIRECTORY its clients use. Starting "
        "a running daemon does nothing.",
        ("mpswrap start --gpus 0", "mpswrap start --job mine --gpus all --threads 50"),
        "entry.manage:cmd_start",
        ("0", "1", "2"),
        _start,
    ),
    Command(
        "stop",
        "end clients (terminate_client), quit and remove daemons",
        "End every client through MPS (terminate_client), quit the daemons and remove their "
        "directories; then check that nothing of the job is left. Exit 1 when something "
        "survived.",
        ("mpswrap stop", "mpswrap stop --job mine"),
        "entry.manage:cmd_stop",
        ("0", "1", "2"),
        _stop,
    ),
    Command(
        "status",
        "daemons, servers, clients and faults of your jobs",
        "Show the daemons, servers, clients and faults of your jobs on this node. Exit 0 when "
        "all is healthy, 3 when something is not, 4 when no daemon of mpswrap is found.",
        ("mpswrap status", "mpswrap status --json --job mine"),
        "entry.manage:cmd_status",
        ("0", "2", "3", "4"),
        _status,
    ),
    Command(
        "report",
        "a finished job's record (log_archive): clients, faults",
        "Print the records that teardowns kept in log_archive for a finished job: clients "
        "seen, how each ended, faults. Exit 4 when there is none.",
        ("mpswrap report 1234", "mpswrap report 1234 --json"),
        "entry.manage:cmd_report",
        ("0", "2", "4"),
        _report,
    ),
    Command(
        "metrics",
        "daemons, servers, clients in Prometheus text format",
        "Print the daemons, servers and clients of your jobs (root: every job) in "
        "Prometheus's text format, or keep them for node_exporter's textfile collector.",
        ("mpswrap metrics", "mpswrap metrics --all --textfile /var/lib/prometheus/node-exporter"),
        "entry.manage:cmd_metrics",
        ("0", "2"),
        _metrics,
    ),
    Command(
        "config",
        "show resolved settings and where each came from",
        "Show every setting, its value and where it came from (argument, MPSWRAP_<NAME> "
        "variable, admin file, default); warn about files root's hooks refuse to read.",
        ("mpswrap config", "mpswrap config --config site.conf --json"),
        "entry.manage:cmd_config",
        ("0", "2"),
        _json,
    ),
    Command(
        "container-args",
        "flags a container runtime needs to reach the job's MPS daemons",
        "Print the flags a container runtime needs so that a rank's client inside reaches its "
        "MPS daemon: the pipe directory bound at the same path, the MPS variables and "
        "mpswrap's rank tag passed in (docs/howto-containers.md). In a job with daemons: that "
        "job's directory; else the directory of every job 'mpswrap run' starts for you here.",
        (
            "mpswrap run -n 2 -- podman run $(mpswrap container-args podman) IMAGE ./app",
            "srun mpswrap -- apptainer exec $(mpswrap container-args apptainer) app.sif ./app",
        ),
        "entry.manage:cmd_container_args",
        ("0", "2"),
        _container_args,
    ),
    Command(
        "demo",
        "start MPS, run clients, show status, tear down",
        "Start MPS, attach clients, show the status and tear everything down, checking that "
        "nothing is left. Without a GPU it uses the built-in MPS simulator (2 GPUs).",
        ("mpswrap demo", "mpswrap demo --clients 8 --simulate yes"),
        "entry.demo:cli",
        ("0", "1", "2"),
        _demo,
    ),
    Command(
        "prolog",
        "Slurm prolog hook (see slurm/README.md)",
        f"The Slurm prolog: start MPS for a job that asks for it (slurm/README.md). {_HOOK}",
        ("mpswrap prolog", "mpswrap prolog --config /etc/mpswrap/mpswrap.conf"),
        "entry.hooks:cli",
        _HOOK_EXITS,
    ),
    Command(
        "task-prolog",
        "Slurm task-prolog hook (see slurm/README.md)",
        "The Slurm task prolog: print the exports that make a task an MPS client of its "
        f"GPU's daemon. {_HOOK}",
        ("mpswrap task-prolog", "mpswrap task-prolog --config /etc/mpswrap/mpswrap.conf"),
        "entry.hooks:cli",
        ("0",),
    ),
    Command(
        "epilog",
        "Slurm epilog hook (see slurm/README.md)",
        f"The Slurm epilog: end the job's clients and daemons through the teardown ladder. {_HOOK}",
        ("mpswrap epilog", "mpswrap epilog --config /etc/mpswrap/mpswrap.conf"),
        "entry.hooks:cli",
        _HOOK_EXITS,
    ),
    Command(
        "install-hooks",
        "install the Slurm hook shims (root; slurm/README.md)",
        "Install the Slurm hook shims (prolog, task prolog, epilog) that run this mpswrap, and "
        "optionally build the SPANK plugin (root; slurm/README.md).",
        ("mpswrap install-hooks", "mpswrap install-hooks --spank --config /etc/mpswrap/site.conf"),
        "slurm.install:install",
        ("0", "1", "2"),
        _install,
        config=False,
    ),
    Command(
        "uninstall-hooks",
        "remove the Slurm hook shims (root)",
        "Remove the Slurm hook shims (root); refused while slurm.conf still names them.",
        ("mpswrap uninstall-hooks", "mpswrap uninstall-hooks --force"),
        "slurm.install:uninstall",
        ("0", "1", "2"),
        _uninstall,
        config=False,
    ),
    Command(
        "sim",
        "the built-in MPS simulator: its programs, a fake GPU list",
        "Run the built-in MPS simulator's commands with mpswrap's own interpreter: "
        "install-bin DIR writes a simulated nvidia-cuda-mps-control and mps-sim-client (a "
        "stand-in for a CUDA program), inventory FILE a fake list of GPUs; set "
        "control_binary and gpu_inventory to them to use mpswrap without a GPU "
        "(docs/tutorial.md).",
        ("mpswrap sim install-bin ~/mps-sim", "mpswrap sim inventory ~/mps-sim/gpus.json --gpus 2"),
        "cli.simcmd:cmd_sim",
        ("0", "2"),
        _sim,
        config=False,
    ),
    Command(
        "version",
        "print the version",
        "Print the version of this mpswrap, as mpswrap --version does.",
        ("mpswrap version", "mpswrap --version"),
        "cli.main:cmd_version",
        ("0", "2"),
        config=False,
    ),
    Command(
        "completion",
        "print the bash completion script",
        "Print the bash completion script for mpswrap, made from its table of commands. The wheel "
        "installs it where bash-completion looks under the environment's prefix.",
        (
            "mpswrap completion bash > ~/.local/share/bash-completion/completions/mpswrap",
            "source <(mpswrap completion bash)",
        ),
        "cli.main:cmd_completion",
        ("0", "2"),
        _completion,
        config=False,
    ),
    Command(
        "help",
        "this help, or a command's: help COMMAND",
        "Show the overview, a command's description, options and examples, or where the man "
        'page is (man -l "$(mpswrap help --man-path)").',
        ("mpswrap help run", "mpswrap help --man-path"),
        "cli.main:cmd_help",
        ("0", "2"),
        _help,
        config=False,
    ),
)

_BY_NAME = {c.name: c for c in COMMANDS}
#: The Slurm hooks (the shims run ``python -I -m mpswrap <hook>``).
HOOKS = tuple(c.name for c in COMMANDS if c.run == "entry.hooks:cli")


def _by_hand(cmd: Command) -> str:
    """A hook's codes are its contract with slurmd, which passes it no argument; run by hand
    with one it does not take, it is a usage error as any command (2)."""
    return "; by hand, an argument it does not take: 2" if cmd.name in HOOKS else ""


def words_of(rest: list[str]) -> Command | None:
    """The command the first words of ``rest`` name (the longest: ``farm status``), if any."""
    for count in (2, 1):
        found = _BY_NAME.get(" ".join(rest[:count])) if len(rest) >= count else None
        if found is not None:
            return found
    return None


def build(cmd: Command, parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The parser of one command: its own arguments, the launch options it takes, --config
    where it takes one, the output options; its description and examples for --help."""
    import argparse
    import textwrap

    from .options import VERBOSITY, add

    parser = parser_class(
        prog=f"mpswrap {cmd.name}",
        usage=cmd.usage,
        description=textwrap.fill(cmd.description, 79),
        epilog="examples:\n"
        + "\n".join(f"  {e}" for e in cmd.examples)
        + f"\n\nexit status: {', '.join(cmd.exits)}{_by_hand(cmd)} (their meanings: man "
        "mpswrap, EXIT STATUS)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    if cmd.arguments is not None:
        cmd.arguments(parser)
    launch = tuple(o for o in WRAPPER_OPTIONS if set(o[0]) & set(cmd.launch))
    if launch:
        add(parser.add_argument_group("launch options"), launch)
    if cmd.config:
        parser.add_argument(
            "--config",
            metavar="FILE",
            type=path,
            help="admin config file to read (default: $MPSWRAP_CONFIG, else "
            "/etc/mpswrap/mpswrap.conf)",
        )
    add(parser.add_argument_group("output"), VERBOSITY)
    return parser
