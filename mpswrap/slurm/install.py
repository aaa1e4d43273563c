"""``mpswrap install-hooks`` / ``uninstall-hooks``: put the Slurm shims on a node, or remove them.

install.sh and uninstall.sh stay the one owner of that logic (path checks, root-owned atomic
copies, the refusal to remove shims slurm.conf still names); this module finds them inside
the installed package and runs them with bash, so a wheel is all an admin needs. Their
messages then start with the command the admin ran (``install-hooks:``), not the script's
name, and an error reads as mpswrap's own (``mpswrap: install-hooks: ...``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from .._proc import SAFE_PATH, run

__all__ = ["add_install_arguments", "add_uninstall_arguments", "install", "uninstall"]

DEFAULT_CONFIG = "/etc/mpswrap/mpswrap.conf"
DEFAULT_DEST = "/usr/local/libexec/mpswrap"
#: install.sh imports mpswrap twice and validates the config: seconds, not minutes.
TIMEOUT = 120.0


def add_install_arguments(parser: argparse.ArgumentParser, path: Callable[[str], str]) -> None:
    """The options of install-hooks; ``path`` (the command line's) refuses an empty one."""
    parser.add_argument(
        "--python",
        type=path,
        default=sys.executable,
        metavar="PATH",
        help="interpreter the hooks run mpswrap with (default: the one running this command)",
    )
    parser.add_argument(
        "--config",
        type=path,
        default=DEFAULT_CONFIG,
        metavar="FILE",
        help="admin config file the hooks read (default: %(default)s)",
    )
    _add_dest(parser, path)
    parser.add_argument(
        "--spank",
        action="store_true",
        help="also build the SPANK plugin for sbatch/salloc/srun --mps[=POLICY] (needs cc and "
        "Slurm's headers: libslurm-dev or slurm-devel)",
    )
    parser.add_argument(
        "--modulefile",
        metavar="DIR",
        type=path,
        help="also write the environment module DIR/mpswrap/VERSION (Tcl, for Lmod and "
        "Environment Modules): 'module load mpswrap' puts mpswrap on PATH and sets "
        "MPSWRAP_CONFIG when --config is not the default (default: none)",
    )


def add_uninstall_arguments(parser: argparse.ArgumentParser, path: Callable[[str], str]) -> None:
    _add_dest(parser, path)
    parser.add_argument(
        "--modulefile",
        metavar="DIR",
        type=path,
        help="also remove the modules install-hooks --modulefile DIR wrote (default: none)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="remove the shims even while slurm.conf still names them",
    )


def _add_dest(parser: argparse.ArgumentParser, path: Callable[[str], str]) -> None:
    parser.add_argument(
        "--dest",
        type=path,
        default=DEFAULT_DEST,
        metavar="DIR",
        help="directory of the prolog, task_prolog and epilog shims (default: %(default)s)",
    )


def install(args: argparse.Namespace) -> int:
    """Install the shims as root (install.sh): ``--python``, ``--config``, ``--dest``, with
    ``--spank`` the SPANK plugin, with ``--modulefile`` the environment module."""
    argv = ["--python", args.python, "--config", args.config, "--dest", args.dest]
    if args.spank:
        argv.append("--spank")
    return _run_script("install.sh", [*argv, *_modules(args), "--prog", "install-hooks"])


def uninstall(args: argparse.Namespace) -> int:
    """Remove the shims (uninstall.sh): ``--dest``, ``--modulefile``, ``--force``."""
    argv = ["--dest", args.dest, *_modules(args), *(["--force"] if args.force else [])]
    return _run_script("uninstall.sh", [*argv, "--prog", "uninstall-hooks"])


def _modules(args: argparse.Namespace) -> list[str]:
    return ["--modulefile", args.modulefile] if args.modulefile else []


def _run_script(name: str, argv: list[str]) -> int:
    """Run a packaged script with bash; pass its output on; its exit status."""
    # The admin's PATH (uninstall.sh looks for scontrol on it) and SLURM_CONF (the cluster
    # scontrol asks); nothing else of the caller's environment.
    env = {"PATH": os.environ.get("PATH") or SAFE_PATH}
    if "SLURM_CONF" in os.environ:
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    from importlib import resources  # here, not at import: the CLI's other commands need none

    with resources.as_file(resources.files("mpswrap.slurm") / name) as script:
        res = run(["bash", str(script), *argv], env=env, timeout=TIMEOUT)
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    return res.returncode
