"""The farm benchmark's table and issue 33's ratios, from a results file of farm_bench.py.

    python benchmarks/farm_report.py benchmarks/results/DATE-h100-farm.json

For each task set, each way it ran (mode and K): the median makespan with its spread and the
number of runs, tasks finished per second (median), and the tasks that failed or were recorded
``oom`` over all runs. Then the acceptance of issue 33, from the medians of one file (one
visit): light and hetero, auto's throughput over the best fixed K's (target >= 0.95, the best
among the fixed K that never failed a task); memory, today's default failing in every run, auto
with 0 failures in every run and its makespan over the best non-failing fixed K's (<= 1.10).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SETS = ("light", "hetero", "memory")
#: The issue's targets: auto / best fixed throughput (light, hetero); auto / best fixed
#: makespan (memory).
THROUGHPUT_TARGET = 0.95
MAKESPAN_TARGET = 1.10
REPEATS_WANTED = 3
#: farm_bench.py's auto modes: commands the farm has not seen, and known ones (its profile).
AUTO = {"auto": "auto", "auto-known": "auto, known commands"}


@dataclass(frozen=True)
class Way:
    """One way a set ran (mode and K) and its runs."""

    mode: str
    k: int | None
    runs: list[dict[str, Any]]

    @property
    def label(self) -> str:
        if self.mode in AUTO:
            final = sorted({str(k) for k in self.final_ks()})
            return f"{AUTO[self.mode]} (final K {'/'.join(final) or '?'})"
        what = {"fixed": "fixed", "default": "today's default", "waves": "raw MPS waves of"}
        return f"{what.get(self.mode, self.mode)} K={self.k}"

    def final_ks(self) -> list[int]:
        return [e["k"] for r in self.runs for e in (r.get("packing") or {}).values() if "k" in e]

    def makespans(self) -> list[float]:
        return [float(r["makespan_s"]) for r in self.runs]

    def throughputs(self) -> list[float]:
        return [(r.get("done") or 0) / float(r["makespan_s"]) for r in self.runs]

    def failed(self) -> int:
        return sum((r.get("failed") or 0) for r in self.runs)

    def oom(self) -> int:
        return sum((r.get("oom") or 0) for r in self.runs)

    def clean(self) -> bool:
        """Every run finished every task, none failed or hit out-of-memory."""
        return all(
            not r.get("failed") and not r.get("oom") and r.get("done") == r.get("tasks")
            for r in self.runs
        )

    def failing_runs(self) -> int:
        return sum(1 for r in self.runs if r.get("failed") or r.get("oom"))


def ways(data: dict[str, Any], name: str) -> list[Way]:
    """The ways set ``name`` ran, in the order first seen."""
    grouped: dict[tuple[str, int | None], list[dict[str, Any]]] = {}
    for run in data["runs"]:
        if run.get("what") == "set" and run.get("set") == name:
            grouped.setdefault((run["mode"], run.get("k")), []).append(run)
    return [Way(mode, k, runs) for (mode, k), runs in grouped.items()]


def _cell(values: Sequence[float], digits: int = 1) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f} (1 run)"
    return (
        f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f}, {len(values)} runs)"
    )


def table(found: list[Way]) -> list[str]:
    lines = [
        "| how | makespan s, median (min-max, runs) | tasks/s, median | failed | oom |",
        "|---|---|---|---|---|",
    ]
    for way in found:
        tput = f"{statistics.median(way.throughputs()):.3f}"
        lines.append(
            f"| {way.label} | {_cell(way.makespans())} | {tput} | {way.failed()} | {way.oom()} |"
        )
    return lines


def _best_fixed(found: list[Way]) -> Way | None:
    """The fixed K (fixed or today's default) that never failed, with the best median
    throughput."""
    clean = [w for w in found if w.mode in ("fixed", "default") and w.clean()]
    return max(clean, key=lambda w: statistics.median(w.throughputs()), default=None)


def _few(found: list[Way]) -> list[str]:
    short = [w.label for w in found if len(w.runs) < REPEATS_WANTED]
    return [f"fewer than {REPEATS_WANTED} runs: {', '.join(short)}"] if short else []


def _autos(found: list[Way]) -> list[Way]:
    """The auto ways that ran: unseen commands first, then known ones."""
    return [w for mode in AUTO for w in found if w.mode == mode]


def verdict_throughput(found: list[Way]) -> list[str]:
    """Light and hetero: each auto way / best fixed K, throughput medians."""
    best, autos = _best_fixed(found), _autos(found)
    if not autos or best is None:
        return ["auto / best fixed K: not measured (needs auto and a fixed K that never failed)"]
    lines = []
    for auto in autos:
        ratio = statistics.median(auto.throughputs()) / statistics.median(best.throughputs())
        met = "met" if ratio >= THROUGHPUT_TARGET and auto.clean() else "NOT met"
        lines.append(
            f"{AUTO[auto.mode]} / best fixed K ({best.label}) throughput: {ratio:.3f} "
            f"(target >= {THROUGHPUT_TARGET}): {met}"
        )
        if not auto.clean():
            lines.append(f"{AUTO[auto.mode]} lost tasks: {auto.failed()} failed, {auto.oom()} oom")
    return lines + _few(found)


def verdict_memory(found: list[Way]) -> list[str]:
    """Memory: today's default fails in every run; auto never does, and its makespan is
    within 10% of the best fixed K that never failed."""
    lines = []
    default = next((w for w in found if w.mode == "default"), None)
    if default is not None:
        shown = "shown failing" if default.failing_runs() == len(default.runs) else "NOT failing"
        lines.append(
            f"{default.label}: tasks failed or oom in {default.failing_runs()} of "
            f"{len(default.runs)} runs ({default.failed()} failed, {default.oom()} oom): {shown}"
        )
    best = min(
        (w for w in found if w.mode in ("fixed", "default") and w.clean()),
        key=lambda w: statistics.median(w.makespans()),
        default=None,
    )
    autos = _autos(found)
    if not autos or best is None:
        return [*lines, "auto / best fixed K: not measured"]
    for auto in autos:
        name = AUTO[auto.mode]
        zero = "met" if auto.clean() else "NOT met"
        lines.append(
            f"{name}: {auto.failed()} failed, {auto.oom()} oom over all runs: 0 failures {zero}"
        )
        ratio = statistics.median(auto.makespans()) / statistics.median(best.makespans())
        met = "met" if ratio <= MAKESPAN_TARGET else "NOT met"
        lines.append(
            f"{name} / best non-failing fixed K ({best.label}) makespan: {ratio:.3f} "
            f"(target <= {MAKESPAN_TARGET}): {met}"
        )
        tput = statistics.median(auto.throughputs()) / statistics.median(best.throughputs())
        met = "met" if tput >= THROUGHPUT_TARGET and auto.clean() else "NOT met"
        lines.append(
            f"{name} / best non-failing fixed K throughput: {tput:.3f} (issue 44: >= "
            f"{THROUGHPUT_TARGET} with 0 oom): {met}"
        )
    failing = [f"{w.label} {w.oom()} oom, {w.failed()} failed" for w in found if not w.clean()]
    lines += [f"fixed K that lost tasks: {'; '.join(failing)}"] if failing else []
    return lines + _few(found)


def render(data: dict[str, Any]) -> str:
    meta = data.get("meta", {})
    dates = sorted({r.get("date", "?") for r in data["runs"]})
    out = [
        f"### farm benchmark: {meta.get('gpu', '?')}, driver {meta.get('driver', '?')}, "
        f"torch {meta.get('torch', '-')}, {', '.join(dates)}, commit "
        f"{str(meta.get('commit', '?'))[:12]}{', tree changed' if meta.get('dirty') else ''}",
        f"best fixed K {meta.get('best_k', '?')} from {meta.get('best_k_from', '?')}; "
        f"today's default K {meta.get('default_k', '?')}; sizes {meta.get('sizes', '?')}",
    ]
    for name in SETS:
        found = ways(data, name)
        if not found:
            continue
        verdict = verdict_memory(found) if name == "memory" else verdict_throughput(found)
        out += ["", f"Set `{name}`:", "", *table(found), "", *(f"- {v}" for v in verdict)]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("file", type=Path)
    args = ap.parse_args()
    print(render(json.loads(args.file.read_text())), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
