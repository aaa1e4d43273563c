"""Pictures of what happened, for people: matplotlib, an optional extra (``mpswrap[plot]``),
imported only when a plot is asked for.

``farm status --plot``: K on each GPU and the finished-task throughput over time, from the
``packing`` history of the farm's status record (``farm status --json``): one panel a GPU,
K as steps, the throughput the controller measured as points on a second axis.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..paths import uncreatable

__all__ = ["plot_packing", "pyplot", "ready", "save"]


def pyplot() -> Any:
    """matplotlib's pyplot without a display, or the one-line refusal that names the extra
    (asked before any work starts, so a missing extra never costs a run)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib", hint="pip install 'mpswrap[plot]'") from None
    return plt


def ready(path: str) -> None:
    """Refuse a plot before any work starts: without matplotlib (``pyplot``), or where
    ``path`` cannot be written (a directory, a folder that is not there or not writable):
    a bad value of ``--plot``, exit 2."""
    pyplot()
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    cause = None
    if os.path.isdir(target):
        cause = "a directory"
    elif not os.path.isdir(folder):
        cause = f"no directory {folder}"
    elif not os.access(folder, os.W_OK | os.X_OK):
        cause = f"{folder} is not writable by uid {os.geteuid()}"
    elif os.path.exists(target) and not os.access(target, os.W_OK):
        cause = f"not writable by uid {os.geteuid()}"
    else:  # a read-only file system, one of the kernel's (/proc, /sys)
        cause = uncreatable(Path(folder))
    if cause:
        raise UsageError("cannot write the plot", thing=path, cause=cause, hint=_HINT)


def save(fig: Any, path: str, **kwargs: Any) -> None:
    """``fig`` saved to ``path``, the name as given (a name without a suffix is a PNG, not
    ``<path>.png``); a write that fails is one line (exit 2), never a traceback."""
    plt = pyplot()
    try:
        fig.savefig(path, format=None if os.path.splitext(path)[1] else "png", **kwargs)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError("cannot write the plot", thing=path, cause=why, hint=_HINT) from None
    finally:
        plt.close(fig)


_HINT = "give --plot a file in a directory you can write, e.g. plot.png"


def _histories(status: Mapping[str, Any]) -> dict[str, list[Mapping[str, Any]]]:
    """The ``packing`` history of each GPU that has one, in time order."""
    packing = status.get("packing") or {}
    out = {}
    for gpu, entry in sorted(packing.items()):
        points = [p for p in (entry or {}).get("history") or [] if p.get("t") is not None]
        if points:
            out[gpu] = sorted(points, key=lambda p: float(p["t"]))
    return out


def plot_packing(status: Mapping[str, Any], path: str, title: str = "") -> None:
    """K and throughput over time, one panel a GPU, saved to ``path`` (PNG by its name)."""
    histories = _histories(status)
    if not histories:
        raise UsageError(
            "farm status --plot: the farm's record has no K history",
            thing=str(status.get("directory", "")),
            hint="farms of this mpswrap record it (mpswrap farm --per-gpu auto)",
        )
    plt = pyplot()
    t0 = min(float(h[0]["t"]) for h in histories.values())
    fig, axes = plt.subplots(
        len(histories), 1, figsize=(7, 2.6 * len(histories) + 0.6), squeeze=False, sharex=True
    )
    end = _end(status, max(float(h[-1]["t"]) for h in histories.values()))
    for ax, (gpu, points) in zip(axes[:, 0], histories.items(), strict=True):
        _panel(ax, gpu, points, t0, end)
    axes[-1, 0].set_xlabel("seconds since the farm's first K")
    fig.suptitle(title or "K per GPU and finished-task throughput")
    fig.tight_layout()
    save(fig, path, dpi=120)


def _end(status: Mapping[str, Any], last: float) -> float:
    """Where the last K ends: the farm's end, else the record's time (it still runs)."""
    ends = [s.get("ended") for s in status.get("shares") or []]
    known = [float(e) for e in ends if e is not None]
    if known and len(known) == len(ends):
        return max(last, *known)
    return max(last, float(status.get("time") or last))


def _panel(ax: Any, gpu: str, points: list[Mapping[str, Any]], t0: float, end: float) -> None:
    ts = [float(p["t"]) - t0 for p in points]
    ks = [int(p["k"]) for p in points]
    ax.step([*ts, end - t0], [*ks, ks[-1]], where="post", color="C0", label="K")
    ax.set_ylabel("K (tasks at once)", color="C0")
    ax.set_ylim(0, max(ks) + 1)
    ax.set_title(gpu, fontsize=9)
    ax.grid(alpha=0.3)
    measured = [(t, p["throughput"]) for t, p in zip(ts, points, strict=True)]
    measured = [(t, float(v)) for t, v in measured if v is not None]
    if measured:
        twin = ax.twinx()
        twin.plot(*zip(*measured, strict=True), "o--", color="C1", label="tasks/s")
        twin.set_ylabel("finished tasks per second", color="C1")
        twin.set_ylim(bottom=0)
