"""THE launcher table: one row per launcher mpswrap can prefix (``mpswrap srun|mpirun|
torchrun ...``), as ``job.containers.RUNTIMES`` has one row per container runtime. A new
launcher is one row here and its command line's grammar in ``launchargs``; nothing else
lists launchers (the CLI, completion, the capacity check and the signal rules read this).

Each row says:

- ``names``: the commands (``os.path.basename`` up to the first dot: ``mpirun.openmpi``);
- ``exports``: how a rank on another node gets a variable of the launch: inherited
  (srun, torchrun), or an option per name (Open MPI's ``-x NAME``);
- ``local_rank``/``local_size``: the variables its ranks get (``jobenv`` reads them, the
  innermost launcher first);
- ``rank_env``: variables its ranks' teardown needs unless the user set them (Open MPI
  SIGKILLs a rank's process group ``odls_base_sigkill_timeout`` seconds after its SIGTERM:
  longer than a dozen ranks' ladders through one busy daemon take);
- ``daemons``: its per-node processes whose children are the ranks (Open MPI's ``orted``,
  PRRTE's ``prted``, MPICH hydra's proxies), which srun may start as a step of their own.
"""

from __future__ import annotations

import os

from .._struct import Struct, field

__all__ = ["LAUNCHERS", "OPEN_MPI", "SRUN", "TORCHRUN", "Launcher", "daemon_names", "launcher_of"]


class Launcher(Struct, frozen=True):
    family: str
    names: tuple[str, ...]
    #: The option that passes one variable to remote ranks (``-x``); None: inherited.
    export_option: str | None = None
    local_rank: tuple[str, ...] = ()
    local_size: tuple[str, ...] = ()
    rank_env: dict[str, str] = field(default_factory=dict)
    daemons: tuple[str, ...] = ()
    #: The words of the launcher's own signal handling users meet (docs/howto-users.md).
    kills: str = ""


SRUN = Launcher(
    "srun",
    ("srun",),
    local_rank=("SLURM_LOCALID",),
    local_size=("SLURM_STEP_TASKS_PER_NODE",),
    kills="SIGTERM to every task of the step at once, SIGKILL KillWait seconds later",
)
#: Open MPI (and PRRTE's prun); Open MPI 4 and 5. odls_base_sigkill_timeout T (default 1 s):
#: when mpirun aborts (a signal, a failed rank) it SIGTERMs every rank's process group after
#: T and SIGKILLs it, client included, after 2T (seen with Open MPI 4.1). The ladder of a
#: dozen ranks through one busy real daemon needed more than 1 s on an H100; T also delays
#: the SIGTERM, so it stays small.
OPEN_MPI = Launcher(
    "ompi",
    ("mpirun", "mpiexec", "orterun", "prun", "prterun"),
    export_option="-x",
    local_rank=("OMPI_COMM_WORLD_LOCAL_RANK",),
    local_size=("OMPI_COMM_WORLD_LOCAL_SIZE",),
    rank_env={"OMPI_MCA_odls_base_sigkill_timeout": "5"},
    daemons=("orted", "prted", "hydra_pmi_proxy", "hydra_bstrap_proxy"),
    kills="SIGTERM to each rank's process group, SIGKILL odls_base_sigkill_timeout later",
)
#: PyTorch's elastic launcher: its workers run ``--no-python`` through the wrapper.
TORCHRUN = Launcher(
    "torchrun",
    ("torchrun",),
    local_rank=("LOCAL_RANK",),
    local_size=("LOCAL_WORLD_SIZE",),
    kills="SIGTERM to every worker, SIGKILL 30 s later (its agent's default)",
)
LAUNCHERS: tuple[Launcher, ...] = (SRUN, OPEN_MPI, TORCHRUN)


def launcher_of(word: str) -> Launcher | None:
    """The row of the command ``word`` (a path, ``mpirun.openmpi``), or None."""
    base = os.path.basename(word).split(".")[0]
    return next((row for row in LAUNCHERS if base in row.names), None)


def daemon_names() -> tuple[str, ...]:
    """Every launcher's per-node daemon names, and the launchers' own names (srun's but):
    a process below one of them was started by that launcher, not by srun alone, and a
    step that runs one (``srun torchrun ...``, mpirun's orted) has ranks below it, which
    must not all inherit one GPU."""
    return tuple(n for row in LAUNCHERS for n in (*row.daemons, *row.names) if row is not SRUN)
