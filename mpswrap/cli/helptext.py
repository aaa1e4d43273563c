"""What each command says about itself: a description and two examples, shown by
``mpswrap help COMMAND``, ``mpswrap COMMAND --help``, the man page and docs/reference.md (all
built from the one parser, which takes them from here), and the words an inherited option
needs where it means something else."""

from __future__ import annotations

__all__ = ["COMMANDS", "OPTION_HELP"]

#: command -> (description, two examples). Every command of the parser has an entry.
COMMANDS: dict[str, tuple[str, tuple[str, str]]] = {
    "start": (
        "Start one MPS control daemon per GPU, as you (user mode) or, as root, for another "
        "user. Prints each daemon and the CUDA_MPS_PIPE_DIRECTORY its clients use. Starting "
        "a running daemon does nothing.",
        ("mpswrap start --gpus 0", "mpswrap start --job mine --gpus all --threads 50"),
    ),
    "stop": (
        "End every client through MPS (terminate_client), quit the daemons and remove their "
        "directories; then check that nothing of the job is left. Exit 1 when something "
        "survived.",
        ("mpswrap stop", "mpswrap stop --job mine"),
    ),
    "status": (
        "Show the daemons, servers, clients and faults of your jobs on this node. Exit 0 when "
        "all is healthy, 3 when something is not, 4 when no daemon of mpswrap is found.",
        ("mpswrap status", "mpswrap status --json --job mine"),
    ),
    "config": (
        "Show every setting, its value and where it came from (argument, MPSWRAP_<NAME> "
        "variable, admin file, default); warn about files root's hooks refuse to read.",
        ("mpswrap config", "mpswrap config --config site.conf --json"),
    ),
    "demo": (
        "Start MPS, attach clients, show the status and tear everything down, checking that "
        "nothing is left. Without a GPU it uses the built-in MPS simulator (2 GPUs).",
        ("mpswrap demo", "mpswrap demo --clients 8 --simulate yes"),
    ),
    "run": (
        "Run N ranks of a program on this node without a scheduler: one MPS daemon per GPU "
        "used, the ranks placed by --policy, each an MPS client; exit code of the first rank "
        "that fails.",
        ("mpswrap run -n 4 -- python train.py", "mpswrap run -n 8 --gpus 0,1 -- ./app"),
    ),
    "farm": (
        "Run many independent commands, one a line of TASKS, K at "
        "a time on each GPU. Logs and state go to --dir; running it again skips the tasks "
        "already done there. 'mpswrap farm status [DIR]' tells, from any shell, how a farm is "
        "doing.",
        ("mpswrap farm --per-gpu 8 --dir results tasks.txt", "mpswrap farm status results"),
    ),
    "calibrate": (
        "Time 1, 2, 4, ... copies of a program on one GPU, time-sliced and under MPS, and "
        "recommend the copies per GPU (farm --per-gpu) and the --threads policy.",
        ("mpswrap calibrate -- python step.py", "mpswrap calibrate --counts 1,4,8 -- ./app"),
    ),
    "report": (
        "Print the records that teardowns kept in log_archive for a finished job: clients "
        "seen, how each ended, faults. Exit 4 when there is none.",
        ("mpswrap report 1234", "mpswrap report 1234 --json"),
    ),
    "metrics": (
        "Print the daemons, servers and clients of your jobs (root: every job) in "
        "Prometheus's text format, or keep them for node_exporter's textfile collector.",
        (
            "mpswrap metrics",
            "mpswrap metrics --all --textfile /var/lib/prometheus/node-exporter",
        ),
    ),
    "container-args": (
        "Print the flags a container runtime needs so that a rank's client inside reaches its "
        "MPS daemon: the pipe directory bound at the same path, the MPS variables and "
        "mpswrap's rank tag passed in (docs/howto-containers.md). In a job with daemons: that "
        "job's directory; else the directory of every job 'mpswrap run' starts for you here.",
        (
            "mpswrap run -n 2 -- podman run $(mpswrap container-args podman) IMAGE ./app",
            "srun mpswrap -- apptainer exec $(mpswrap container-args apptainer) app.sif ./app",
        ),
    ),
    "prolog": (
        "The Slurm prolog: start MPS for a job that asks for it (slurm/README.md). Run by "
        "slurmd through the shim install-hooks writes, not by hand.",
        ("mpswrap prolog", "mpswrap prolog --config /etc/mpswrap/mpswrap.conf"),
    ),
    "task-prolog": (
        "The Slurm task prolog: print the exports that make a task an MPS client of its "
        "GPU's daemon. Run by slurmd through the shim, not by hand.",
        ("mpswrap task-prolog", "mpswrap task-prolog --config /etc/mpswrap/mpswrap.conf"),
    ),
    "epilog": (
        "The Slurm epilog: end the job's clients and daemons through the teardown ladder. "
        "Run by slurmd through the shim, not by hand.",
        ("mpswrap epilog", "mpswrap epilog --config /etc/mpswrap/mpswrap.conf"),
    ),
    "version": (
        "Print the version of this mpswrap, as mpswrap --version does.",
        ("mpswrap version", "mpswrap --version"),
    ),
    "install-hooks": (
        "Install the Slurm hook shims (prolog, task prolog, epilog) that run this mpswrap, and "
        "optionally build the SPANK plugin (root; slurm/README.md).",
        ("mpswrap install-hooks", "mpswrap install-hooks --spank --config /etc/mpswrap/site.conf"),
    ),
    "uninstall-hooks": (
        "Remove the Slurm hook shims (root); refused while slurm.conf still names them.",
        ("mpswrap uninstall-hooks", "mpswrap uninstall-hooks --force"),
    ),
    "sim": (
        "Run the built-in MPS simulator's commands with mpswrap's own interpreter: "
        "install-bin DIR writes a simulated nvidia-cuda-mps-control and mps-sim-client (a "
        "stand-in for a CUDA program), inventory FILE a fake list of GPUs; set "
        "control_binary and gpu_inventory to them to use mpswrap without a GPU "
        "(docs/tutorial.md).",
        ("mpswrap sim install-bin ~/mps-sim", "mpswrap sim inventory ~/mps-sim/gpus.json --gpus 2"),
    ),
    "completion": (
        "Print the bash completion script for mpswrap (made from this parser). Source it, or "
        "save it where bash-completion looks.",
        (
            "mpswrap completion bash > ~/.local/share/bash-completion/completions/mpswrap",
            "source <(mpswrap completion bash)",
        ),
    ),
    "help": (
        "Show the overview, a command's description, options and examples, or where the man "
        'page is (man -l "$(mpswrap help --man-path)").',
        ("mpswrap help run", "mpswrap help --man-path"),
    ),
}

#: (command, option) -> its help there, for an inherited option that means something else.
OPTION_HELP: dict[tuple[str, str], str] = {
    ("farm", "--policy"): "no effect on a farm: it has no ranks to map; each task goes to the "
    "next free seat, K (--per-gpu) on each GPU, filling every GPU (default: the gpu_policy "
    "setting, block)",
    ("calibrate", "--policy"): "no effect on calibrate: its copies all run on one GPU "
    "(default: the gpu_policy setting, block)",
}
