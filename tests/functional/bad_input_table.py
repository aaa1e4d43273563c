"""The bad-input table: each case, the exact message and exit code mpswrap must give.

One source for two readers: tests/functional/test_bad_input.py runs every case as a test, and
``python -m tests.functional.bad_input_table`` (as root, from the repository root) runs them
and prints the markdown table of docs/reliability.md "Bad input" from what actually happened,
so the documentation shows real output.

Each case runs ``python -m mpswrap`` against its own simulated node (tests/simenv.py). Paths
of that node are written ``<root>`` and the test user's ids ``{uid}``/``{gid}``. "Nothing
left" means no file or directory appeared under the node (the configured run directory
roots themselves excepted: like /run/mpswrap they may stay) and no process of the node runs.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mpswrap._proc import SAFE_PATH
from mpswrap.config import FIELDS
from tests.simenv import SimNode, finish_sim_node, make_sim_node
from tests.tree import REPO
from tests.users import ensure_test_user, user_argv

ROOT = "<root>"
JOB = ("--job", "j1", "--node", "n1")
VALID = "valid settings: " + ", ".join(sorted(f.name for f in FIELDS))
NAME_RULE = "expected letters, digits, '.', '_' or '-' (no '/' or '..'), at most 64"
#: Variables that would change behaviour inside an allocation (as tests/conftest.py clears).
_JOB_VARS = re.compile(
    r"^(SLURM_|SLURMD_|OMPI_|PMI_|PMIX_|PALS_|MV2_|FLUX_|CUDA_|MPSWRAP_|"
    r"MPI_LOCAL|LOCAL_RANK|LOCAL_WORLD_SIZE|RANK$|WORLD_SIZE$)"
)


@dataclass(frozen=True)
class Case:
    name: str
    area: str
    argv: tuple[str, ...]
    stderr: str
    code: int
    env: dict[str, str] = field(default_factory=dict)
    #: Admin-file text; MPSWRAP_CONFIG points at it.
    config: str | None = None
    #: Name of a function in SETUPS that prepares the node.
    setup: str | None = None
    #: Run as the test user (user mode) instead of root.
    as_user: bool = False
    #: A Slurm hook: the fake Slurm job environment is added (job 101 of the test user).
    hook: bool = False
    #: The option whose value is bad, as ``COMMAND --FLAG`` (``--FLAG`` alone: the launch
    #: modes' wrapper options); its message names it (test_bad_input checks both).
    option: str = ""


@dataclass
class Outcome:
    code: int
    stderr: str
    stdout: str
    created: list[str]
    processes: list[str]

    @property
    def clean(self) -> bool:
        return not self.created and not self.processes


def _prolog(gpus: str, **env: str) -> dict[str, str]:
    return {"SLURM_JOB_GPUS": gpus, **env}


#: The prolog's line for SLURM_JOB_GPUS=x; the test node has no Slurm controller, so the drain
#: call that follows times out.
#: The scontrol a hook runs: found on the hooks' fixed PATH, named by its absolute path.
_SCONTROL = shutil.which("scontrol", path=SAFE_PATH) or "scontrol"
_GPUS_X = "malformed SLURM_JOB_GPUS ('x'): expected GPU numbers like 0,2-3 or GPU UUIDs"


def _cont(line: str) -> str:
    """A prolog error under prolog_failure = continue: the error, then that it goes on."""
    prefix = "mpswrap: prolog: job 101 node n1: "
    return f"{prefix}{line}\n{prefix}continuing without MPS (prolog_failure = continue)"


APP = ("--", "{client}", "--seconds", "0.1")
_SIM_BIN_HINT = "give a directory you can write, e.g. ~/mps-sim"
_THREADS = "expected none, uniform, oversubscribe, a percentage in (0, 100] or weights w1:w2:..."
_RUN_DIR_HINT = "set run_dir / user_run_dir, or MPSWRAP_USER_RUN_DIR"
_KERNEL_FS = "/proc is on proc, a file system of the kernel's"
_TEXTFILE_HINT = "give a directory you can write (node_exporter's --collector.textfile.directory)"
START_HELP = "hint: mpswrap start --help"


def _bad(
    command: str,
    flag: str,
    value: str,
    message: str,
    *rest: str,
    hint: str | None = None,
    setup: str | None = None,
) -> Case:
    """A bad value of one option: exit 2 and one line naming the option (``argument FLAG:``
    from the parser, or the check that knows the limit)."""
    words = tuple(command.split())
    name = f"value-{command or 'wrap'}{flag}-{value or 'empty'}".replace("/", "-").replace(" ", "-")
    if hint is None:
        hint = f"\nhint: mpswrap {command} --help" if message.startswith("argument") else ""
    argv = (*words, flag, value, *rest)
    option = f"{command} {flag}".strip()
    return Case(
        name, "option value", argv, f"mpswrap: {message}{hint}", 2, setup=setup, option=option
    )


_SECONDS_0 = "expected seconds above 0 and at most 31622400"
_SECONDS_FROM_0 = "expected seconds from 0 to 31622400"
_GRACE = "expected seconds from 0 to 3600"
_GPUS = "expected all, GPU indices like 0,2-3 or GPU UUIDs"  # the kill_grace setting's range
# fmt: off
#: A bad value of every option of every command that takes one (test_bad_input checks that
#: none is missing; the launch modes share their wrapper options, each covered once).
OPTION_VALUES: tuple[Case, ...] = (
    _bad("", "--verify-timeout", "0", f"argument --verify-timeout: invalid value '0': "
         f"{_SECONDS_0}", *APP, hint="\nhint: mpswrap --help"),
    _bad("", "--grace", "-1", f"argument --grace: invalid value '-1': {_GRACE}",
         *APP, hint="\nhint: mpswrap --help"),
    _bad("", "--job", "..", f"argument --job: invalid value '..': {NAME_RULE}", *APP,
         hint="\nhint: mpswrap --help"),
    _bad("", "--mem-limit", "0G", "argument --mem-limit: invalid value '0G': expected auto or a "
         "size like 512M or 2G", *APP, hint="\nhint: mpswrap --help"),
    _bad("", "--gpus", "", "argument --gpus: invalid value '': expected all, GPU indices like "
         "0,2-3 or GPU UUIDs", *APP, hint="\nhint: mpswrap --help"),
    _bad("", "--priority", "2", "argument --priority: invalid value '2': expected 0 (normal) "
         "or 1 (below normal)", *APP, hint="\nhint: mpswrap --help"),
    _bad("", "--verify-attach", "maybe", "argument --verify-attach: invalid value 'maybe': "
         "expected one of warn, fail, off", *APP, hint="\nhint: mpswrap --help"),
    _bad("", "--gpus-per-rank", "0", "argument --gpus-per-rank: invalid value '0': expected a "
         "whole number from 1 to 999999", *APP, hint="\nhint: mpswrap --help"),
    _bad("run", "--grace", "nan", f"argument --grace: invalid value 'nan': {_GRACE}",
         "-n", "1", *APP),
    _bad("run", "--mem-limit", "99999999999999999999G", "argument --mem-limit: invalid value "
         "'99999999999999999999G': expected auto or a size like 512M or 2G", "-n", "1",
         "--dry-run", *APP),
    _bad("run", "--mem-limit", "-5G", "argument --mem-limit: invalid value '-5G': expected "
         "auto or a size like 512M or 2G", "-n", "1", *APP),
    _bad("run", "--mem-limit", "9999G", "--mem-limit 9999G is more than the GPU's memory "
         "(GPU-5a1d0000-0000-4000-8000-000000000000): 81920M in all", "-n", "1", *APP,
         hint="\nhint: give at most 81920M, or auto"),
    _bad("run", "-n", "x", "argument -n/--np: invalid value 'x': expected a whole number from 1 "
         "to 999999", *APP),
    _bad("farm", "--dir", "", "argument --dir: invalid value '': expected a path", "tasks.txt"),
    Case("container-args-typo", "arguments", ("container-args", "dockr"),
         "mpswrap: argument RUNTIME: invalid value 'dockr': expected one of podman, docker, "
         "apptainer, singularity, enroot, bwrap (did you mean 'docker'?)\n"
         "hint: mpswrap container-args --help", 2),
    Case("farm-tasks-empty", "arguments", ("farm", ""),
         "mpswrap: argument TASKS: invalid value '': expected a path\n"
         "hint: mpswrap farm --help", 2),
    _bad("farm", "--retries", "-1", "argument --retries: invalid value '-1': expected a whole "
         "number from 0 to 999999", "tasks.txt"),
    _bad("farm", "--progress", "loud", "argument --progress: invalid value 'loud': expected "
         "one of auto, bar, lines, off", "tasks.txt"),
    _bad("farm status", "--plot", "", "argument --plot: invalid value '': expected a path"),
    _bad("farm", "--timeout", "0", f"argument --timeout: invalid value '0': {_SECONDS_0}",
         "tasks.txt"),
    _bad("farm", "--heartbeat", "-1", f"argument --heartbeat: invalid value '-1': "
         f"{_SECONDS_FROM_0}", "tasks.txt"),
    _bad("farm", "--halt", "soon", "argument --halt: invalid value 'soon': expected never, or "
         "now or soon with fail=N, success=N or done=N (N >= 1) or with a percentage of the "
         "tasks, e.g. soon,fail=10%", "tasks.txt"),
    _bad("farm", "--gpus", "5", "--gpus: no such GPU (index 5): this node has 2 GPU(s)",
         "tasks.txt", setup="tasks_file", hint="\nhint: list GPUs with: nvidia-smi -L"),
    _bad("calibrate", "--max", "0", "argument --max: invalid value '0': expected a whole "
         "number from 1 to 999999", "--", "true"),
    _bad("calibrate", "--max", "100", "--max asks for more clients than the GPU takes (100): "
         "its limit is 48", "--", "true"),
    _bad("calibrate", "--repeats", "0", "argument --repeats: invalid value '0': expected a "
         "whole number from 1 to 999999", "--", "true"),
    _bad("calibrate", "--plot", "", "argument --plot: invalid value '': expected a path",
         "--", "true"),
    _bad("calibrate", "--dir", "", "argument --dir: invalid value '': expected a path",
         "--", "true"),
    _bad("start", "--run-dir", "", "argument --run-dir: invalid value '': expected a path",
         *JOB),
    _bad("start", "--config", "", "argument --config: invalid value '': expected a path", *JOB),
    _bad("start", "--gpus", "", "argument --gpus: invalid value '': expected all, GPU indices "
         "like 0,2-3 or GPU UUIDs", *JOB),
    _bad("start", "--cpus", "", "argument --cpus: invalid value '': expected CPU numbers like "
         "0,2-3", *JOB),
    _bad("start", "--user", "", "argument --user: invalid value '': expected a user name", *JOB),
    _bad("start", "--threads", "", "argument --threads: invalid value '': expected a percentage "
         "in (0, 100] or none", *JOB),
    _bad("start", "--mem-limit", "", "argument --mem-limit: invalid value '': expected a size "
         "like 512M or 2G", *JOB),
    _bad("stop", "--job", "..", f"argument --job: invalid value '..': {NAME_RULE}"),
    _bad("stop", "--node", "a/b", f"argument --node: invalid value 'a/b': {NAME_RULE}"),
    _bad("stop", "--run-dir", "", "argument --run-dir: invalid value '': expected a path"),
    _bad("stop", "--config", "", "argument --config: invalid value '': expected a path"),
    _bad("status", "--watch", "nan", f"argument --watch: invalid value 'nan': {_SECONDS_0}"),
    _bad("status", "--job", "a/b", f"argument --job: invalid value 'a/b': {NAME_RULE}"),
    _bad("status", "--node", "..", f"argument --node: invalid value '..': {NAME_RULE}"),
    _bad("status", "--run-dir", "", "argument --run-dir: invalid value '': expected a path"),
    _bad("status", "--config", "", "argument --config: invalid value '': expected a path"),
    _bad("metrics", "--textfile", "", "argument --textfile: invalid value '': expected a path"),
    _bad("metrics", "--job", "..", f"argument --job: invalid value '..': {NAME_RULE}"),
    _bad("metrics", "--node", "a/b", f"argument --node: invalid value 'a/b': {NAME_RULE}"),
    _bad("metrics", "--run-dir", "", "argument --run-dir: invalid value '': expected a path"),
    _bad("metrics", "--config", "", "argument --config: invalid value '': expected a path"),
    _bad("container-args", "--config", "", "argument --config: invalid value '': expected a path",
         "podman"),
    _bad("config", "--config", "", "argument --config: invalid value '': expected a path"),
    _bad("report", "--config", "", "argument --config: invalid value '': expected a path", "1"),
    _bad("demo", "--clients", "0", "argument --clients: invalid value '0': expected a whole "
         "number from 1 to 999999"),
    _bad("demo", "--clients", "100", "bad --clients (100): 2 GPU(s) take at most 96 MPS clients "
         "(48 a GPU)", "--simulate", "yes", hint="\nhint: mpswrap demo --clients 96"),
    _bad("demo", "--simulate", "maybe", "argument --simulate: invalid value 'maybe': expected "
         "one of auto, yes, no"),
    _bad("demo", "--config", "", "argument --config: invalid value '': expected a path"),
)
# fmt: on
# fmt: off
CASES: tuple[Case, ...] = (
    # --- environment variables ---------------------------------------------------------------
    Case("slurm-localid-x", "environment", APP,
         "mpswrap: malformed SLURM_LOCALID ('x'): expected a whole number", 2,
         env={"SLURM_LOCALID": "x"}),
    Case("local-rank-negative", "environment", APP,
         "mpswrap: local rank out of range (-3 of 2)", 2,
         env={"OMPI_COMM_WORLD_LOCAL_RANK": "-3", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}),
    Case("user-run-dir-kernel-fs", "environment", ("run", "--dry-run", "-n", "1", *APP),
         f"mpswrap: cannot create the run directory (/proc/x): {_KERNEL_FS}\n"
         f"hint: {_RUN_DIR_HINT}", 2, env={"MPSWRAP_USER_RUN_DIR": "/proc/x"}),
    Case("cvd-minus-one", "environment", APP,
         "mpswrap: CUDA_VISIBLE_DEVICES hides every GPU ('-1')\n"
         "hint: unset CUDA_VISIBLE_DEVICES, or give --gpus", 2,
         env={"CUDA_VISIBLE_DEVICES": "-1"}),
    Case("cvd-no-such-gpu", "environment", APP,
         "mpswrap: CUDA_VISIBLE_DEVICES: no such GPU (index 5): this node has 2 GPU(s)\n"
         "hint: list GPUs with: nvidia-smi -L", 2,
         env={"CUDA_VISIBLE_DEVICES": "5"}),
    Case("job-gpus-malformed", "environment", ("prolog",),
         _cont("malformed SLURM_JOB_GPUS ('0-'): expected GPU numbers like 0,2-3 or GPU "
               "UUIDs"), 0,
         env=_prolog("0-"), hook=True),
    Case("job-gpus-malformed-drain", "environment", ("prolog",),
         "mpswrap: prolog: job 101 node n1: " + _GPUS_X + "\n"
         "mpswrap: prolog: job 101 node n1: could not set the drain reason "
         f'"mpswrap prolog: {_GPUS_X}": timed out ({_SCONTROL} update NodeName=n1 State=DRAIN '
         f"Reason=mpswrap prolog: {_GPUS_X}): no answer in 10 s", 1,
         env=_prolog("x", MPSWRAP_PROLOG_FAILURE="drain"), hook=True),
    Case("job-gpus-not-in-gres", "environment", ("prolog",),
         _cont("Slurm GPU position not in gres.conf (position 5): gres.conf lists 2 GPU(s) "
               "for n1"), 0,
         env=_prolog("5"), hook=True),
    Case("job-uid-unknown", "environment", ("prolog",),
         _cont("unknown user (54321)"), 0,
         env=_prolog("0", SLURM_JOB_UID="54321"), hook=True),
    Case("epilog-no-job-id", "environment", ("epilog",),
         "mpswrap: epilog: node n1: SLURM_JOB_ID is not set: nothing of a job to tear down", 0,
         env={"SLURM_JOB_ID": ""}, hook=True),
    Case("epilog-job-id-slash", "environment", ("epilog",),
         f"mpswrap: epilog: node n1: invalid job id ('a/b'): {NAME_RULE}: nothing of a job to "
         "tear down", 0,
         env={"SLURM_JOB_ID": "a/b"}, hook=True),
    Case("env-bad-timeout", "environment", ("status", *JOB),
         "mpswrap: bad value for quit_timeout ('-1' in MPSWRAP_QUIT_TIMEOUT): expected seconds "
         "above 0 and at most 3600", 2,
         env={"MPSWRAP_QUIT_TIMEOUT": "-1"}),
    Case("env-unknown-variable", "environment", ("stop", *JOB),
         "mpswrap: ignoring MPSWRAP_QUIT_TIMEOT: not a setting (did you mean "
         "MPSWRAP_QUIT_TIMEOUT?)", 0,
         env={"MPSWRAP_QUIT_TIMEOT": "1"}),
    Case("env-client-limit-word", "environment", ("run", "-n", "1", *APP),
         "mpswrap: bad value for client_limit ('abc' in MPSWRAP_CLIENT_LIMIT): expected auto or "
         "a number of clients from 1 to 128", 2,
         env={"MPSWRAP_CLIENT_LIMIT": "abc"}),
    Case("env-log-level-word", "environment", ("status", *JOB),
         "mpswrap: bad value for log_level ('loud' in MPSWRAP_LOG_LEVEL): expected one of debug, "
         "info, warning, error", 2,
         env={"MPSWRAP_LOG_LEVEL": "loud"}),
    Case("xdg-runtime-dir-of-another-user", "environment", ("status", "--node", "n1"),
         "", 4,
         env={"XDG_RUNTIME_DIR": "<root>/xdg-root", "MPSWRAP_USER_RUN_DIR": "none"},
         setup="private_root_xdg_dir", as_user=True),
    Case("env-config-missing", "environment", ("status", *JOB),
         "mpswrap: cannot read config file (/nonexistent/mpswrap.conf): No such file or "
         "directory", 2,
         env={"MPSWRAP_CONFIG": "/nonexistent/mpswrap.conf"}),
    Case("env-relative-run-dir", "environment", ("start", *JOB),
         "mpswrap: bad value for run_dir ('run' in MPSWRAP_RUN_DIR): expected an absolute path",
         2, env={"MPSWRAP_RUN_DIR": "run"}),
    # --- command-line arguments --------------------------------------------------------------
    Case("cli-bad-choice", "arguments", ("start", *JOB, "--priority", "7"),
         "mpswrap: argument --priority: invalid value '7': expected one of 0, 1\n"
         "hint: mpswrap start --help", 2, option="start --priority"),
    Case("cli-unknown-option", "arguments", ("start", "--bogus"),
         "mpswrap: unknown option '--bogus'\nhint: mpswrap start --help", 2),
    Case("cli-near-option", "arguments", ("run", "--polcy", "block", "-n", "1", "--", "true"),
         "mpswrap: unknown option '--polcy' (did you mean '--policy'?)\nhint: mpswrap run --help",
         2),
    Case("cli-near-wrapper-option", "arguments", ("--gpu", "0", "run", "-n", "1", "--", "true"),
         "mpswrap: unknown option '--gpu' (did you mean '--gpus'?)\nhint: mpswrap --help", 2),
    Case("cli-threads-zero", "arguments", ("start", *JOB, "--threads", "0"),
         "mpswrap: argument --threads: invalid value '0': expected a percentage in (0, 100] or "
         f"none\n{START_HELP}", 2, option="start --threads"),
    Case("cli-mem-limit", "arguments", ("start", *JOB, "--mem-limit", "12T"),
         "mpswrap: argument --mem-limit: invalid value '12T': expected a size like 512M or 2G\n"
         f"{START_HELP}", 2, option="start --mem-limit"),
    Case("cli-cpus", "arguments", ("start", *JOB, "--cpus", "a-b"),
         "mpswrap: argument --cpus: invalid value 'a-b': expected numbers like 0,2-3\n"
         f"{START_HELP}", 2, option="start --cpus"),
    Case("run-zero-ranks", "arguments", ("run", "-n", "0", "--", "true"),
         "mpswrap: argument -n/--np: invalid value '0': expected a whole number from 1 to "
         "999999\nhint: mpswrap run --help", 2, option="run -n"),
    Case("run-no-command", "arguments", ("run", "-n", "2"),
         "mpswrap: no command to run\nhint: mpswrap run -n 4 -- python train.py", 2),
    Case("farm-no-task-list", "arguments", ("farm", "/nonexistent/tasks.txt"),
         "mpswrap: cannot read the task list (/nonexistent/tasks.txt): No such file or "
         "directory\nhint: give a file with one command per line, or - for standard input", 2),
    Case("farm-per-gpu-zero", "arguments", ("farm", "--per-gpu", "0", "tasks.txt"),
         "mpswrap: argument --per-gpu: invalid value '0': expected auto or a whole number from 1 "
         "to 999999\nhint: mpswrap farm --help", 2, option="farm --per-gpu"),
    Case("farm-bad-share", "arguments", ("farm", "--share", "2/2", "tasks.txt"),
         "mpswrap: argument --share: invalid value '2/2': expected I/N with 0 <= I < N, e.g. "
         "0/4\nhint: mpswrap farm --help", 2, option="farm --share"),
    Case("calibrate-no-command", "arguments", ("calibrate", "--counts", "1"),
         "mpswrap: no command to calibrate\nhint: mpswrap calibrate -- python train.py", 2),
    Case("calibrate-bad-counts", "arguments", ("calibrate", "--counts", "0,x", "--", "true"),
         "mpswrap: argument --counts: invalid value '0,x': expected copies from 1 to 9999, "
         "separated by commas, e.g. 1,4,8,12\nhint: mpswrap calibrate --help", 2,
         option="calibrate --counts"),
    Case("wrap-threads-150", "arguments", ("--threads", "150", "--", "true"),
         f"mpswrap: argument --threads: invalid value '150': {_THREADS}\nhint: mpswrap --help",
         2, option="--threads"),
    Case("wrap-threads-underscore", "arguments", ("--threads", "5_0", "--", "true"),
         f"mpswrap: argument --threads: invalid value '5_0': {_THREADS}\nhint: mpswrap --help",
         2),
    Case("wrap-bad-policy", "arguments", ("--policy", "random", "--", "true"),
         "mpswrap: argument --policy: invalid value 'random': expected one of block, cyclic, "
         "affinity\nhint: mpswrap --help", 2, option="--policy"),
    *OPTION_VALUES,
    # --- admin file --------------------------------------------------------------------------
    Case("conf-not-key-value", "admin file", ("start", *JOB),
         "mpswrap: expected key = value (<root>/mpswrap.conf:1): 'this is not a setting'", 2,
         config="this is not a setting\n"),
    Case("conf-unknown-key", "admin file", ("start", *JOB),
         f"mpswrap: unknown setting (colour in <root>/mpswrap.conf)\nhint: {VALID}", 2,
         config="colour = red\n"),
    Case("conf-bad-choice", "admin file", ("start", *JOB),
         "mpswrap: bad value for prolog_mode ('sometimes' in <root>/mpswrap.conf): expected one "
         "of always, opt-in, never", 2,
         config="prolog_mode = sometimes\n"),
    Case("conf-relative-run-dir", "admin file", ("start", *JOB),
         "mpswrap: bad value for user_run_dir ('run' in <root>/mpswrap.conf): expected an "
         "absolute path", 2,
         config="user_run_dir = run\n"),
    Case("conf-client-limit", "admin file", ("start", *JOB),
         "mpswrap: bad value for client_limit ('0' in <root>/mpswrap.conf): expected auto or a "
         "number of clients from 1 to 128", 2,
         config="client_limit = 0\n"),
    Case("conf-not-utf8", "admin file", ("start", *JOB),
         "mpswrap: cannot read config file (<root>/mpswrap.conf): not UTF-8 text", 2,
         config="run_dir = /run/mpsw\udce4p\n"),
    # --- command words -------------------------------------------------------------------------
    Case("command-misspelt", "arguments", ("stauts",),
         "mpswrap: unknown command 'stauts' (did you mean 'status'?)\nhint: mpswrap help lists "
         "the commands; to run a program, give its path or use 'mpswrap -- stauts'", 2),
    Case("command-help-misspelt", "arguments", ("hlep",),
         "mpswrap: unknown command 'hlep' (did you mean 'help'?)\nhint: mpswrap help lists "
         "the commands; to run a program, give its path or use 'mpswrap -- hlep'", 2),
    Case("command-not-close", "arguments", ("logs",),
         "mpswrap: unknown command 'logs'\nhint: mpswrap help lists the commands; to run a "
         "program, give its path or use 'mpswrap -- logs'", 2),
    Case("help-not-close", "arguments", ("help", "logs"),
         "mpswrap: no command 'logs'\nhint: mpswrap help", 2),
    Case("completion-other-shell", "arguments", ("completion", "zsh"),
         "mpswrap: argument SHELL: invalid value 'zsh': expected one of bash\n"
         "hint: mpswrap completion --help", 2),
    Case("report-job-slash", "job id", ("report", "a/b"),
         f"mpswrap: argument JOB: invalid value 'a/b': {NAME_RULE}\n"
         "hint: mpswrap report --help", 2),
    Case("program-missing-after-dashdash", "arguments", ("--", "status"),
         "mpswrap: program not found (status)\nhint: check the name and PATH", 127),
    Case("program-without-interpreter", "arguments", ("run", "-q", "-n", "1", "--", "./noshebang"),
         "mpswrap: cannot execute program (./noshebang): Exec format error\n"
         "hint: a script needs a #! line, e.g. #!/bin/sh", 126, setup="scripts"),
    Case("program-link-loop", "arguments", ("--", "./loop1"),
         "mpswrap: cannot execute program (./loop1): Too many levels of symbolic links", 126,
         setup="scripts"),
    Case("program-interpreter-missing", "arguments", ("--", "./badinterp"),
         "mpswrap: cannot execute program (./badinterp): its #! interpreter /nonexistent/sh "
         "cannot be run", 126, setup="scripts"),
    Case("cpus-not-available", "arguments", ("start", *JOB, "--gpus", "0", "--cpus", "4099"),
         "mpswrap: bad --cpus (4099): CPU(s) 4099 not available to this process\n"
         "hint: choose among CPUs {cpus}", 2, option="start --cpus"),
    # --- GPU lists ---------------------------------------------------------------------------
    Case("gpus-no-such-index", "GPU list", ("start", *JOB, "--gpus", "7"),
         "mpswrap: --gpus: no such GPU (index 7): this node has 2 GPU(s)\n"
         "hint: list GPUs with: nvidia-smi -L", 2,
         option="start --gpus"),
    Case("gpus-twice", "GPU list", ("start", *JOB, "--gpus", "0,0"),
         "mpswrap: --gpus: GPU listed twice (0,0)\nhint: name each GPU once", 2),
    Case("gpus-reversed-range", "GPU list", ("start", *JOB, "--gpus", "1-0"),
         f"mpswrap: argument --gpus: invalid value '1-0': {_GPUS}\n{START_HELP}", 2),
    Case("gpus-malformed-uuid", "GPU list", ("start", *JOB, "--gpus", "GPU-zzz"),
         f"mpswrap: argument --gpus: invalid value 'GPU-zzz': {_GPUS}\n{START_HELP}", 2),
    Case("gpus-absent-uuid", "GPU list",
         ("start", *JOB, "--gpus", "GPU-5a1d0009-0000-4000-8000-000000000009"),
         "mpswrap: --gpus: no such GPU (GPU-5a1d0009-0000-4000-8000-000000000009): not among 2 "
         "GPUs\nhint: list GPUs with: nvidia-smi -L", 2),
    Case("run-gpus-no-such-index", "GPU list", ("run", "-n", "1", "--gpus", "5", *APP),
         "mpswrap: --gpus: no such GPU (index 5): this node has 2 GPU(s)\n"
         "hint: list GPUs with: nvidia-smi -L", 2,
         option="--gpus"),
    Case("gpus-none-in-inventory", "GPU list", ("start", *JOB),
         "mpswrap: no GPUs found (<root>/empty.json)", 1,
         env={"MPSWRAP_GPU_INVENTORY": "<root>/empty.json"}, setup="empty_inventory"),
    Case("inventory-missing", "GPU list", ("start", *JOB),
         "mpswrap: cannot read GPU inventory file (<root>/none.json): No such file or directory",
         2, env={"MPSWRAP_GPU_INVENTORY": "<root>/none.json"}),
    Case("inventory-not-json", "GPU list", ("run", "-n", "1", *APP),
         "mpswrap: cannot read GPU inventory file (/etc/passwd): not JSON (line 1 column 1)", 2,
         env={"MPSWRAP_GPU_INVENTORY": "/etc/passwd"}),
    Case("inventory-not-an-inventory", "GPU list", ("start", *JOB),
         "mpswrap: cannot read GPU inventory file (<root>/empty.json): not an inventory: expected "
         "an object whose \"gpus\" is a list of GPUs (as mpswrap sim inventory writes)", 2,
         env={"MPSWRAP_GPU_INVENTORY": "<root>/empty.json"}, setup="no_gpus_field"),
    # --- job ids and node names --------------------------------------------------------------
    Case("job-dotdot", "job id", ("start", "--job", "..", "--node", "n1"),
         f"mpswrap: argument --job: invalid value '..': {NAME_RULE}\n{START_HELP}", 2,
         option="start --job"),
    Case("job-slash", "job id", ("start", "--job", "a/b", "--node", "n1"),
         f"mpswrap: argument --job: invalid value 'a/b': {NAME_RULE}\n{START_HELP}", 2),
    Case("job-too-long", "job id", ("start", "--job", "x" * 65, "--node", "n1"),
         f"mpswrap: argument --job: invalid value '{'x' * 65}': {NAME_RULE}\n{START_HELP}", 2),
    Case("job-empty", "job id", ("start", "--job", "", "--node", "n1"),
         f"mpswrap: argument --job: invalid value '': {NAME_RULE}\n{START_HELP}", 2),
    Case("job-newline", "job id", ("start", "--job", "j1\n", "--node", "n1"),
         f"mpswrap: argument --job: invalid value 'j1\\n': {NAME_RULE}\n{START_HELP}", 2),
    Case("node-slash", "job id", ("start", "--job", "j1", "--node", "a/b"),
         f"mpswrap: argument --node: invalid value 'a/b': {NAME_RULE}\n{START_HELP}", 2,
         option="start --node"),
    # --- paths -------------------------------------------------------------------------------
    Case("run-dir-relative-missing", "path", ("start", *JOB, "--run-dir", "rel/dir"),
         "mpswrap: cannot create the run directory (<root>/rel/dir): <root>/rel does not exist\n"
         f"hint: {_RUN_DIR_HINT}", 2),
    Case("run-dir-too-long", "path", ("start", *JOB, "--run-dir", "/tmp/" + "y" * 90),
         "mpswrap: pipe directory too long for MPS sockets "
         f"(/tmp/{'y' * 90}/n1/j1/g0/pipe): 128 bytes with 'control_privileged', limit 107\n"
         "hint: set a shorter run_dir (e.g. /run/mpswrap)", 1),
    Case("run-dir-symlink", "path", ("start", *JOB),
         "mpswrap: refusing a path that is not a plain directory (<root>/user)\n"
         f"hint: {_RUN_DIR_HINT}", 2, setup="symlink_user_run_dir", as_user=True),
    Case("job-dir-symlink", "path", ("start", *JOB),
         "mpswrap: refusing a path that is not a plain directory (<root>/run/n1/j1)", 1,
         setup="symlink_job_dir"),
    Case("run-dir-other-owner", "path", ("start", *JOB),
         "mpswrap: directory has the wrong owner (<root>/user): owned by uid 0, expected {uid}\n"
         "hint: remove the stale directory (mpswrap stop / the epilog does this)", 2,
         setup="root_owned_user_run_dir", as_user=True),
    Case("run-dir-not-writable", "path", ("start", *JOB),
         "mpswrap: run directory not writable (<root>/user): <root>/user is not writable by "
         f"uid {{uid}}\nhint: {_RUN_DIR_HINT}", 2, setup="private_root_user_run_dir",
         as_user=True),
    Case("run-dir-in-proc", "path", ("start", *JOB, "--run-dir", "/proc/x"),
         "mpswrap: run directory not writable (/proc/x): /proc is not writable by uid {uid}\n"
         f"hint: {_RUN_DIR_HINT}", 2, as_user=True),
    Case("farm-dir-in-proc", "path", ("farm", "--dir", "/proc/x", "tasks.txt"),
         f"mpswrap: cannot create the farm directory (/proc/x/logs): {_KERNEL_FS}\n"
         "hint: give --dir a directory you can write", 2, setup="tasks_file"),
    Case("farm-dry-run-dir-in-proc", "path", ("farm", "--dry-run", "--dir", "/proc/x",
                                              "tasks.txt"),
         f"mpswrap: cannot create the farm directory (/proc/x/logs): {_KERNEL_FS}\n"
         "hint: give --dir a directory you can write", 2, setup="tasks_file"),
    Case("calibrate-dry-run-plot-in-proc", "path",
         ("calibrate", "--dry-run", "--plot", "/proc/x.png", "--", "true"),
         f"mpswrap: cannot write the plot (/proc/x.png): {_KERNEL_FS}\n"
         "hint: give --plot a file in a directory you can write, e.g. plot.png", 2),
    Case("farm-dir-a-file", "path", ("farm", "--dir", "tasks.txt", "tasks.txt"),
         "mpswrap: cannot create the farm directory (tasks.txt/logs): Not a directory\n"
         "hint: give --dir a directory you can write", 2, setup="tasks_file"),
    Case("run-dir-open-to-others", "path", ("start", *JOB),
         "mpswrap: directory is open to other users (<root>/user): mode 0777, expected 0700\n"
         "hint: chmod go-rwx <root>/user, or use another directory", 2,
         setup="open_user_run_dir", as_user=True),
    Case("control-binary-missing", "path", ("start", *JOB),
         "mpswrap: MPS control program not found (/nonexistent/nvidia-cuda-mps-control): not an "
         "executable file\nhint: set control_binary to the nvidia-cuda-mps-control path", 2,
         env={"MPSWRAP_CONTROL_BINARY": "/nonexistent/nvidia-cuda-mps-control"}),
    Case("sim-bin-not-writable", "path", ("sim", "install-bin", "/etc/mpswrap-sim"),
         "mpswrap: cannot write the simulator's programs (/etc/mpswrap-sim): Permission denied\n"
         f"hint: {_SIM_BIN_HINT}", 2, as_user=True),
    Case("sim-bin-no-parent", "path", ("sim", "install-bin", "/nonexistent/a/b"),
         "mpswrap: cannot write the simulator's programs (/nonexistent): Permission denied\n"
         f"hint: {_SIM_BIN_HINT}", 2, as_user=True),
    Case("sim-bin-in-proc", "path", ("sim", "install-bin", "/proc/x"),
         "mpswrap: cannot write the simulator's programs (/proc/x): No such file or directory\n"
         f"hint: {_SIM_BIN_HINT}", 2),
    Case("sim-bin-a-file", "path", ("sim", "install-bin", "/etc/passwd"),
         "mpswrap: cannot write the simulator's programs (/etc/passwd): Not a directory\n"
         f"hint: {_SIM_BIN_HINT}", 2),
    Case("sim-bin-empty", "path", ("sim", "install-bin", ""),
         "mpswrap: argument DIR: invalid value '': expected a path\n"
         "hint: mpswrap sim install-bin --help", 2),
    Case("sim-inventory-a-directory", "path", ("sim", "inventory", "<root>", "--gpus", "2"),
         "mpswrap: cannot write the GPU inventory (<root>): Is a directory\n"
         "hint: give a file you can write, e.g. ~/mps-sim/gpus.json", 2),
    Case("sim-inventory-empty", "path", ("sim", "inventory", "", "--gpus", "2"),
         "mpswrap: argument FILE: invalid value '': expected a path\n"
         "hint: mpswrap sim inventory --help", 2),
    Case("metrics-textfile-not-writable", "path", ("metrics", "--textfile", "/etc"),
         "mpswrap: --textfile: cannot write the metrics file (/etc/mpswrap.prom): Permission "
         f"denied\nhint: {_TEXTFILE_HINT}", 2, as_user=True),
    Case("metrics-textfile-proc", "path", ("metrics", "--textfile", "/proc"),
         "mpswrap: --textfile: cannot write the metrics file (/proc/mpswrap.prom): No such file "
         f"or directory\nhint: {_TEXTFILE_HINT}", 2),
    # --- users -------------------------------------------------------------------------------
    Case("user-unknown", "user", ("start", *JOB, "--user", "nosuchuser"),
         "mpswrap: --user: unknown user (nosuchuser)", 2, option="start --user"),
    Case("user-not-root", "user", ("start", *JOB, "--user", "root"),
         "mpswrap: --user needs root (root)", 2, as_user=True),
)
# fmt: on


# --- node set-ups ---------------------------------------------------------------------------
def _empty_inventory(node: SimNode, uid: int) -> None:
    path = node.root / "empty.json"
    path.write_text('{"driver_version": "580", "cuda_driver_version": 13000, "gpus": []}\n')
    path.chmod(0o644)


def _no_gpus_field(node: SimNode, uid: int) -> None:
    path = node.root / "empty.json"
    path.write_text('{"driver_version": "580"}\n')
    path.chmod(0o644)


def _symlink_user_run_dir(node: SimNode, uid: int) -> None:
    target = node.root / "target"
    target.mkdir(mode=0o700)
    os.chown(target, uid, uid)
    node.user_run_dir.symlink_to(target)


def _symlink_job_dir(node: SimNode, uid: int) -> None:
    target = node.root / "target"
    target.mkdir(mode=0o700)
    (node.run_dir / "n1").mkdir(parents=True)
    (node.run_dir / "n1" / "j1").symlink_to(target)


def _root_owned_user_run_dir(node: SimNode, uid: int) -> None:
    node.user_run_dir.mkdir()
    node.user_run_dir.chmod(0o777)


def _private_root_user_run_dir(node: SimNode, uid: int) -> None:
    node.user_run_dir.mkdir(mode=0o700)


def _private_root_xdg_dir(node: SimNode, uid: int) -> None:
    """An ``XDG_RUNTIME_DIR`` that belongs to root (inherited through su/sudo)."""
    (node.root / "xdg-root").mkdir(mode=0o700)


def _open_user_run_dir(node: SimNode, uid: int) -> None:
    node.user_run_dir.mkdir()
    os.chown(node.user_run_dir, uid, uid)
    node.user_run_dir.chmod(0o777)


def _tasks_file(node: SimNode, uid: int) -> None:
    (node.root / "tasks.txt").write_text("true\n")


def _scripts(node: SimNode, uid: int) -> None:
    """Two executable files the kernel will not run: one without a #! line, one whose #!
    names a program that is not there; and two links that name each other."""
    for name, text in (("noshebang", "echo hi\n"), ("badinterp", "#!/nonexistent/sh\n")):
        (node.root / name).write_text(text)
        (node.root / name).chmod(0o755)
    (node.root / "loop1").symlink_to("loop2")  # and a loop of links
    (node.root / "loop2").symlink_to("loop1")


SETUPS: dict[str, Callable[[SimNode, int], None]] = {
    "tasks_file": _tasks_file,
    "scripts": _scripts,
    "empty_inventory": _empty_inventory,
    "no_gpus_field": _no_gpus_field,
    "symlink_user_run_dir": _symlink_user_run_dir,
    "symlink_job_dir": _symlink_job_dir,
    "root_owned_user_run_dir": _root_owned_user_run_dir,
    "private_root_user_run_dir": _private_root_user_run_dir,
    "open_user_run_dir": _open_user_run_dir,
    "private_root_xdg_dir": _private_root_xdg_dir,
}


# --- running a case -------------------------------------------------------------------------
def _tree(root: Path) -> set[str]:
    """Every path under root, without following symlinks."""
    out: set[str] = set()
    for top, dirs, files in os.walk(root):
        out.update(os.path.join(top, n) for n in (*dirs, *files))
    return out


def _fill(text: str, node: SimNode, uid: int, gid: int) -> str:
    return (
        text.replace(ROOT, str(node.root))
        .replace("{client}", node.client)
        .replace("{uid}", str(uid))
        .replace("{gid}", str(gid))
    )


def _env(case: Case, node: SimNode, uid: int, gid: int) -> dict[str, str]:
    # The node's settings (its MPSWRAP_* variables), nothing of a job this process may be in.
    mine = node.env()
    env = {k: v for k, v in mine.items() if k.startswith("MPSWRAP_") or not _JOB_VARS.match(k)}
    env.update(PYTHONPATH=str(REPO))  # every `python -m mpswrap` of a case runs the tree's code
    if case.hook:
        env.update(
            SLURM_JOB_ID="101",
            SLURM_JOB_UID=str(uid),
            SLURM_JOB_GID=str(gid),
            SLURMD_NODENAME="n1",
            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="100",
            SLURM_CONF=str(node.root / "slurm.conf"),
            MPSWRAP_PROLOG_MODE="always",
            MPSWRAP_SYSLOG="no",
        )
    if case.config is not None:
        conf = node.root / "mpswrap.conf"
        conf.write_bytes(_fill(case.config, node, uid, gid).encode("utf-8", "surrogateescape"))
        conf.chmod(0o644)
        env["MPSWRAP_CONFIG"] = str(conf)
    env.update({k: _fill(v, node, uid, gid) for k, v in case.env.items()})
    return {k: v for k, v in env.items() if v != ""}


def run_case(case: Case, timeout: float = 120) -> Outcome:
    """Run one case on a fresh simulated node; report what it printed, left and created."""
    user = ensure_test_user()
    entry = pwd.getpwnam(user)
    uid, gid = entry.pw_uid, entry.pw_gid
    node = make_sim_node(gpus=2)
    try:
        if case.setup:
            SETUPS[case.setup](node, uid)
        env = _env(case, node, uid, gid)
        before = _tree(node.root)
        argv = [sys.executable, "-m", "mpswrap", *(_fill(a, node, uid, gid) for a in case.argv)]
        if case.as_user:
            argv = user_argv(user, argv, env)
        res = subprocess.run(
            argv, env=env, cwd=node.root, text=True, capture_output=True, timeout=timeout
        )
        roots = {str(node.run_dir), str(node.user_run_dir)}
        new = {p for p in _tree(node.root) - before - roots if "__pycache__" not in p}
        created = sorted(p for p in new if os.path.dirname(p) not in new)  # topmost only
        stop_everything(node)
        processes = finish_sim_node(node)
    except BaseException:
        finish_sim_node(node)
        raise
    shown = str(node.root)

    cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))))

    def anon(text: str) -> str:
        for word in ("uid", "expected"):
            text = text.replace(f"{word} {uid}", f"{word} {{uid}}")
        return text.replace(shown, ROOT).replace(f"CPUs {cpus}", "CPUs {cpus}")

    return Outcome(
        res.returncode,
        anon(res.stderr.rstrip("\n")),
        anon(res.stdout),
        [anon(p) for p in created],
        processes,
    )


def stop_everything(node: SimNode) -> None:
    """Daemons a failing case started anyway: stop them through mpswrap, as a user would."""
    for run_dir in (node.run_dir, node.user_run_dir):
        for job_dir in run_dir.glob("*/*"):
            if job_dir.is_dir() and not job_dir.is_symlink():
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "mpswrap",
                        "stop",
                        "--run-dir",
                        str(run_dir),
                        "--node",
                        job_dir.parent.name,
                        "--job",
                        job_dir.name,
                    ],
                    env={**node.env(), "PYTHONPATH": str(REPO)},
                    capture_output=True,
                    timeout=120,
                    check=False,
                )


# --- the markdown table -----------------------------------------------------------------------
def _cell(text: str, code: bool = True) -> str:
    """One table cell: a code span for one line, plain text with <br> for several."""
    if "Traceback (most recent call last)" in text:
        text = "Traceback (…) " + text.strip().splitlines()[-1]
    text = text.replace("|", "\\|")
    if "\n" in text or not code:  # plain text: <root> must not read as an HTML tag
        text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        return text.replace("\n", "<br>")
    return f"`{text}`" if text else ""


def shown_input(case: Case) -> str:
    """How the case reads in the table: variables and the command line, then how it runs."""
    words = [f"{k}={v!r}" if not v or " " in v else f"{k}={v}" for k, v in case.env.items()]
    args = [repr(a) if (not a or any(c in a for c in " \n")) else a for a in case.argv]
    text = " ".join([*words, "mpswrap", *("./app" if a == "{client}" else a for a in args)])
    text = text.replace("-- ./app --seconds 0.1", "-- ./app")
    if len(text) > 90:
        text = text[:60] + "…" + text[-20:]
    notes = []
    if case.config is not None:
        notes.append(f"admin file line {case.config.strip()!r}")
    if case.setup:
        notes.append(case.setup.replace("_", " "))
    if case.hook:
        notes.append("fake Slurm job 101 of the test user")
    if case.as_user:
        notes.append("as the non-root test user")
    return f"`{text}`" + (f" ({'; '.join(notes)})" if notes else "")


def as_expected(case: Case, out: Outcome) -> bool:
    return out.code == case.code and out.stderr == case.stderr and out.clean


def markdown(results: list[tuple[Case, Outcome]]) -> str:
    rows = [
        "| # | area | input | exit | stderr (exact) | nothing left | as expected |",
        "|---|---|---|---|---|---|---|",
    ]
    for number, (case, out) in enumerate(results, 1):
        left = "yes" if out.clean else "NO: " + ", ".join(out.created + out.processes)
        verdict = "yes"
        if not as_expected(case, out):
            verdict = f"**NO**: expected exit {case.code}, {_cell(case.stderr)}"
        rows.append(
            f"| {number} | {case.area} | {shown_input(case)} | {out.code} "
            f"| {_cell(out.stderr)} | {_cell(left, code=False)} | {verdict} |"
        )
    passed = sum(1 for case, out in results if as_expected(case, out))
    rows += ["", f"{passed} of {len(results)} cases as expected."]
    return "\n".join(rows)


def main() -> int:
    if os.geteuid() != 0:
        print("run as root: the cases use a second (test) user", file=sys.stderr)
        return 2
    results = []
    for case in CASES:
        results.append((case, run_case(case)))
        print(f"{case.name}: exit {results[-1][1].code}", file=sys.stderr)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
