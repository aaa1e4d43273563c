"""What tests do to a run's processes from outside, as a scheduler would."""

from __future__ import annotations

import subprocess

import psutil


def signal_tree(proc: subprocess.Popen[str], sig: int) -> int:
    """Signal every process of the run at the same moment, as scancel does to a step; how
    many there were."""
    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for member in tree:
        try:
            member.send_signal(sig)
        except psutil.Error:
            pass
    return len(tree)
