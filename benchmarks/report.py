"""Tables (Markdown) and a throughput plot from the JSON files of benchmarks/run.py.

    python benchmarks/report.py benchmarks/results/*.json [--plot docs/benchmarks-throughput.png]

Medians over the repeats, with the spread (min-max) and the number of repeats; each figure
compares only measurements of one file (one visit to one machine), never across files.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MODES = ("timesliced", "rawmps", "mpswrap")
#: Run on request only: mpswrap's daemon with the workers started plainly (no supervisor).
EXTRA = ("mpswrap-daemon",)
TITLES = {
    "timesliced": "time-sliced",
    "rawmps": "raw MPS",
    "mpswrap": "mpswrap",
    "mpswrap-daemon": "mpswrap daemon, no supervisor",
}


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    data["file"] = path.name
    return data


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.2f} (1 run)"
    return f"{med:.2f} ({min(values):.2f}-{max(values):.2f}, {len(values)} runs)"


def _ratio(num: list[float], den: list[float]) -> str:
    if not num or not den:
        return "-"
    return f"{statistics.median(num) / statistics.median(den):.2f}x"


def throughput_table(data: dict[str, Any], workload: str) -> list[str]:
    """Wall time of N processes started together, per mode; speed-ups from the medians."""
    walls: dict[tuple[int, str], list[float]] = defaultdict(list)
    starts: dict[tuple[int, str], list[float]] = defaultdict(list)
    for run in data["runs"]:
        if run.get("workload") == workload and run.get("mode") and not run.get("threads"):
            walls[run["n"], run["mode"]].append(run["wall_s"])
            starts[run["n"], run["mode"]].append(run["startup_s"])
    ns = sorted({n for n, _ in walls})
    if not ns:
        return []
    modes = MODES + tuple(m for m in EXTRA if any(mode == m for _, mode in walls))
    head = " | ".join(f"{TITLES[m]} wall s" for m in modes)
    extra = "".join(f" | {TITLES[m]} / raw MPS throughput" for m in modes[len(MODES) :])
    short = " / ".join(("ts", "raw", "mpswrap", "daemon")[: len(modes)])
    lines = [
        f"| N | {head} | MPS speed-up | mpswrap / raw MPS throughput{extra} "
        f"| start-up s ({short}) |",
        "|---|" + "---|" * (2 * len(modes)),
    ]
    for n in ns:
        cells = " | ".join(_cell(walls[n, m]) for m in modes)
        speed = _ratio(walls[n, "timesliced"], walls[n, "rawmps"])
        wraps = " | ".join(_ratio(walls[n, "rawmps"], walls[n, m]) for m in modes[2:])
        up = " / ".join(
            f"{statistics.median(starts[n, m]):.1f}" if starts[n, m] else "-" for m in modes
        )
        lines.append(f"| {n} | {cells} | {speed} | {wraps} | {up} |")
    return lines


def _class_seconds(run: dict[str, Any], heavy: bool) -> float | None:
    """Median working time of the heavy (weight > 1) or light workers of one run."""
    times = [w["end"] - w["start"] for w in run["workers"] if (w.get("weight", 1) > 1) == heavy]
    return statistics.median(times) if times else None


def provisioning_table(data: dict[str, Any]) -> list[str]:
    """The mixed set: each mode, and mpswrap under each ``--threads`` policy, against
    mpswrap without a limit; with the heavy and the light workers' own times."""
    walls: dict[str, list[float]] = defaultdict(list)
    classes: dict[tuple[str, bool], list[float]] = defaultdict(list)
    for run in data["runs"]:
        if run.get("workload") != "mixed":
            continue
        row = TITLES.get(run["mode"], run["mode"])
        if run["mode"] == "mpswrap":
            row = f"mpswrap --threads {run.get('threads') or 'none'}"
        walls[row].append(run["wall_s"])
        for is_heavy in (True, False):
            seconds = _class_seconds(run, is_heavy)
            if seconds is not None:
                classes[row, is_heavy].append(seconds)
    if not walls:
        return []
    base = walls.get("mpswrap --threads none", [])
    lines = [
        "| mode | wall s (whole set) | speed-up vs mpswrap --threads none "
        "| heavy workers s | light workers s |",
        "|---|---|---|---|---|",
    ]
    for row, values in walls.items():
        heavy, light = (_cell(classes[row, h]) for h in (True, False))
        lines.append(f"| {row} | {_cell(values)} | {_ratio(base, values)} | {heavy} | {light} |")
    return lines


def overhead_table(data: dict[str, Any]) -> list[str]:
    lines = ["| what | measure | median ms (min-max) |", "|---|---|---|"]
    for run in data["runs"]:
        if not run["key"].startswith("overhead/"):
            continue
        what = run["key"].split("/", 1)[1]
        for measure in ("prolog", "epilog_no_clients", "epilog", "status", "start"):
            if measure in run:
                v = run[measure]
                lines.append(
                    f"| {what} | {measure} | {v['median_ms']} ({v['min_ms']}-{v['max_ms']}) |"
                )
        if "rss_mib" in run:
            guard = f", guard RSS {run['guard_rss_mib']} MiB (USS {run['guard_uss_mib']} MiB)"
            lines.append(f"| {what} | memory | supervisor RSS {run['rss_mib']} MiB{guard} |")
    return lines if len(lines) > 2 else []


def revision(meta: dict[str, Any]) -> str:
    """The commit the file names (benchmarks/revision.py); files made before it name none."""
    if not meta.get("commit"):
        return "commit not recorded"
    states: dict[object, str] = {True: ", tree changed", False: ""}  # else "unknown" or absent
    state = states.get(meta.get("dirty"), ", tree state unknown")
    return f"commit {meta['commit'][:12]}{state}"


def header(data: dict[str, Any]) -> list[str]:
    meta = data.get("meta", {})
    dates = sorted({r["date"] for r in data["runs"]})
    lines = [
        f"### {data['file']}: {meta.get('gpu', '?')}, driver {meta.get('driver', '?')}, "
        f"torch {meta.get('torch', '-')}, Python {meta.get('python', '?')}, "
        f"{', '.join(dates)}, {revision(meta)}"
    ]
    for what, key in (("GPUs", "gpu_uuid"), ("commits", "commit")):
        seen = sorted({r[key] for r in data["runs"] if r.get(key)})
        if len(seen) > 1:
            lines += ["", f"Runs of this file come from {len(seen)} {what}: {', '.join(seen)}."]
    return lines


def markdown(files: Iterable[dict[str, Any]]) -> str:
    out: list[str] = []
    for data in files:
        out += header(data)
        for workload in ("mlp", "nbody", "mixed"):
            table = throughput_table(data, workload)
            if table:
                out += ["", f"Workload `{workload}`:", "", *table]
        for title, table in (
            ("Provisioning study, mixed set", provisioning_table(data)),
            ("Overheads", overhead_table(data)),
        ):
            if table:
                out += ["", f"{title}:", "", *table]
        out.append("")
    return "\n".join(out)


def plot(files: list[dict[str, Any]], path: Path) -> None:
    """Throughput (steps/s, all processes) against N, one line per mode and file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for data in files:
        for mode in MODES + EXTRA:
            points: dict[int, list[float]] = defaultdict(list)
            for run in data["runs"]:
                same = run.get("workload") == "mlp" and run.get("mode") == mode
                if same and not run.get("threads"):
                    points[run["n"]].append(run["throughput_steps_per_s"])
            if points:
                ns = sorted(points)
                ys = [statistics.median(points[n]) for n in ns]
                ax.plot(ns, ys, marker="o", label=f"{TITLES[mode]} ({data['file']})")
    ax.set_xlabel("processes on one GPU (N)")
    ax.set_ylabel("training steps per second, all processes")
    ax.set_title("Small-MLP workers: throughput vs N")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--plot", type=Path, help="write a PNG of MLP throughput vs N")
    args = ap.parse_args()
    files = [load(p) for p in args.files]
    print(markdown(files))
    if args.plot:
        plot(files, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
