"""What Prometheus's own tools and conventions say of an exposition mpswrap wrote.

``promtool check metrics`` (Debian's ``prometheus`` package, which tools/test.sh installs)
lints names, help texts and counters; it does not see a series written twice or a label
that names a process, so those are checked here too.
"""

from __future__ import annotations

import shutil
import subprocess

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["exposition_problems"]

#: Labels that make a new series for every process (``--process-labels`` only).
PROCESS_LABELS = frozenset({"pid", "command", "server_pid", "cmdline"})


def exposition_problems(text: str, process_labels: bool = False) -> list[str]:
    """What promtool says of ``text``, and every series written twice or (without
    ``process_labels``) labelled by a process; empty when it is clean."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is needed: apt-get install prometheus (tools/test.sh does)"
    res = subprocess.run(
        [promtool, "check", "metrics"], input=text, text=True, capture_output=True, timeout=60
    )
    found = (
        [f"promtool (exit {res.returncode}): {res.stdout}{res.stderr}"] if res.returncode else []
    )
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series = (sample.name, tuple(sorted(sample.labels.items())))
            if series in seen:
                found.append(f"written twice: {series}")
            seen.add(series)
            named = set(sample.labels) & PROCESS_LABELS
            if named and not process_labels:
                found.append(f"{sample.name} labelled by a process: {sorted(named)}")
    return found
