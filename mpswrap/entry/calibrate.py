"""``mpswrap calibrate -- CMD``: how many copies of CMD one GPU should run at once, and how.

It runs 1, 2, 4, ... copies of CMD at once on one GPU of the job (up to ``--max``: the
client limit, a CPU per copy and 16 at most, by default), each count three ways: time-sliced
(no MPS: the copies get a pipe directory no daemon listens on), under MPS with no thread
limit, and under MPS with ``oversubscribe`` (each copy min(100, 200/N) % of the threads).
Throughput is copies per second of makespan; the median of ``--repeats`` runs. The copies run
through the task farm's engine (``farm.engine``), so they are started, checked and ended as the
farm's tasks are, and their logs are kept under ``--dir`` when one fails.

It recommends the count and policy with the best throughput, i.e. ``mpswrap farm --per-gpu K
--threads POLICY``, says where ``--per-gpu auto`` would settle on the same measurements (the
farm's rule, ``job.packing.converge``, walked over the best policy's throughputs), and saves a
plot with ``--plot FILE`` (matplotlib, optional).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from .._signals import SignalTrap
from .._struct import Struct, asdict, field
from ..errors import UsageError
from ..job.placement import Slot
from ..job.run import LaunchOptions, Result, Run, plan
from ..report import plots
from ..taskfarm.engine import Farmer, FarmPlan
from ..taskfarm.journal import FarmDir
from ..taskfarm.lanes import Lane
from ..taskfarm.packing import MARGIN, Packing, converge
from ..taskfarm.recorder import Recorder
from ..taskfarm.sizing import default_per_gpu
from ..taskfarm.tasks import parse_tasks

__all__ = ["MODES", "Calibration", "auto_choice", "counts_up_to", "recommend", "run_calibrate"]

log = logging.getLogger(__name__)

#: The ways each count runs: (name, MPS?, --threads policy).
MODES = (("time-sliced", False, None), ("mps", True, None), ("mps-200/n", True, "oversubscribe"))


class Calibration(Struct, frozen=True):
    """One configuration's runs."""

    copies: int
    mode: str
    seconds: list[float]  # makespan of each repeat
    failed: int  # copies that did not exit 0, over all repeats

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def throughput(self) -> float:
        return self.copies / self.median if self.median > 0 else 0.0


def counts_up_to(top: int) -> list[int]:
    """1, 2, 4, ... and ``top`` itself."""
    out, n = [], 1
    while n < top:
        out.append(n)
        n *= 2
    return [*out, top]


def recommend(rows: Sequence[Calibration]) -> Calibration | None:
    """The MPS configuration with the best throughput among those where every copy exited 0."""
    good = [r for r in rows if r.mode != "time-sliced" and not r.failed]
    return max(good, key=lambda r: r.throughput, default=None)


def auto_choice(rows: Sequence[Calibration]) -> tuple[Calibration, Packing] | None:
    """Where ``--per-gpu auto`` would settle: the farm's rule over the throughputs of the
    best configuration's policy (its clean counts), and the walk that got there."""
    best = recommend(rows)
    if best is None:
        return None
    mine = {r.copies: r for r in rows if r.mode == best.mode and not r.failed}
    walk = converge({k: r.throughput for k, r in mine.items()}, max(mine))
    return mine[walk.k], walk


def run_calibrate(
    opts: LaunchOptions,
    command: Sequence[str],
    *,
    top: int | None,
    counts: Sequence[int] | None,
    repeats: int,
    plot: str | None,
    as_json: bool,
    directory: str,
) -> int:
    if not command:
        raise UsageError("no command to calibrate", hint="mpswrap calibrate -- python train.py")
    for option, value in (("--max", top), ("--repeats", repeats), ("--counts", min(counts or [1]))):
        if value is not None and value < 1:
            raise UsageError(f"bad {option}", thing=str(value), cause="need at least 1")
    if plot:
        plots.ready(plot)  # refuse before hours of runs (a dry run too), not after
    planned = plan(opts, "calibrate")
    n_gpus = len(planned.slots)  # a farm of this job would share the CPUs among them
    planned = planned.use(1, gpus=1)  # the first GPU of the job (or of --gpus)
    plan_counts = _counts(counts, top, max(1, planned.free()), n_gpus, planned.env.cpu_count)
    planned = planned.use(max(plan_counts), "block")
    planned.check_program(command)
    FarmDir(directory).check()  # where the copies' logs go: a dry run refuses it too
    if opts.dry_run:
        print(
            f"calibrate: would run {', '.join(map(str, plan_counts))} "
            f"{'copy' if plan_counts == [1] else 'copies'} at once, each "
            f"{len(MODES)} ways, {repeats} time(s), on {planned.uuids[0]}: {shlex.join(command)}"
        )
        return 0
    rows: list[Calibration] = []
    with Run(planned) as run:  # its own table, no node line
        run.result = run.stopped or _calibrated(
            run, command, counts=plan_counts, repeats=repeats, directory=directory, rows=rows
        )
    if run.result is None or run.result.code:  # told to stop: no table of what did not run
        return run.code
    _report(rows, as_json, plot)
    clean = recommend(rows) is not None and not any(
        r.failed for r in rows if r.mode != "time-sliced"
    )
    return 0 if clean and not run.code else 1


def _calibrated(
    run: Run,
    command: Sequence[str],
    *,
    counts: Sequence[int],
    repeats: int,
    directory: str,
    rows: list[Calibration],
) -> Result:
    """Every configuration measured into ``rows``; 128+signal when told to stop."""
    no_mps = tempfile.mkdtemp(prefix="mpswrap-nomps-")
    try:
        planned = run.plan
        grace = planned.opts.grace_s(planned.settings)
        bench = _Bench(
            run,
            planned.slots[0],
            shlex.join(command),
            FarmPlan(0, grace, planned.env.node, verify="off"),
            directory,
            no_mps,
            existed=os.path.exists(directory),
        )
        return Result(_measure(bench, list(counts), repeats, run.trap, rows))
    finally:
        shutil.rmtree(no_mps, ignore_errors=True)


def _counts(
    counts: Sequence[int] | None, top: int | None, limit: int, n_gpus: int, cpus: int
) -> list[int]:
    """The copies to try: as given (within the GPU's client limit), or 1, 2, 4, ... up to
    ``--max`` or what ``mpswrap farm`` would take by default."""
    for option, asked in (("--counts", max(counts or [0])), ("--max", top or 0)):
        if asked > limit:  # refused, never quietly fewer copies than asked for
            raise UsageError(
                f"{option} asks for more clients than the GPU takes",
                thing=str(asked),
                cause=f"its limit is {limit}",
            )
    return list(counts or counts_up_to(min(limit, top or default_per_gpu(limit, n_gpus, cpus))))


class _Bench(Struct, frozen=True):
    """What every run of one calibration shares."""

    started: Run
    slot: Slot
    command: str
    plan: FarmPlan
    directory: str
    no_mps: str  # a pipe directory no daemon listens on
    #: The directories of the runs, created here (the only ones removed when all went well).
    created: list[str] = field(default_factory=list)
    existed: bool = False

    def env(self, lane: Lane, seat: int, copies: int, threads: str | None) -> dict[str, str]:
        if lane.daemon is None:
            return {
                "CUDA_VISIBLE_DEVICES": self.slot.uuid,
                "CUDA_MPS_PIPE_DIRECTORY": self.no_mps,
                "CUDA_MPS_LOG_DIRECTORY": self.no_mps,
            }
        planned = self.started.plan
        return planned.place(seat, copies, policy="block", threads=threads, slots=[self.slot]).env

    def run(
        self, copies: int, mode: tuple[str, bool, str | None], trap: SignalTrap
    ) -> tuple[int, float, int]:
        """(exit code: 0 or 128+signal, makespan, copies that failed) of one run."""
        name, mps, threads = mode
        daemon = self.started.daemon(self.slot) if mps else None
        lane = Lane(0, self.slot, daemon, list(range(copies)))
        farm_dir = FarmDir(os.path.join(self.directory, f"{name.replace('/', '')}-{copies}"))
        if not farm_dir.path.exists():
            self.created.append(str(farm_dir.path))
        tasks = parse_tasks([self.command] * copies)
        recorder = Recorder(farm_dir.create(), self.plan.node)
        farmer = Farmer(
            [lane],
            tasks,
            self.plan,
            recorder=recorder,
            client_env=lambda ln, seat: self.env(ln, seat, copies, threads),
        )
        start = time.monotonic()
        try:
            code = farmer.run(trap)
        finally:
            recorder.close()
        took = time.monotonic() - start
        return code, took, recorder.tally.failed + recorder.tally.interrupted


def _measure(
    bench: _Bench, counts: list[int], repeats: int, trap: SignalTrap, rows: list[Calibration]
) -> int:
    """Every configuration, the repeats interleaved; 128+signal when told to stop."""
    runs: dict[tuple[int, str], list[float]] = {}
    failed: dict[tuple[int, str], int] = {}
    total, done = repeats * len(counts) * len(MODES), 0
    for repeat in range(repeats):
        for copies in counts:
            for mode in MODES:
                code, took, bad = bench.run(copies, mode, trap)
                if code:
                    return code
                done += 1
                log.info(  # progress: calibrate is silent for minutes otherwise
                    "calibrate: run %d of %d: %d at once, %s: %.2f s%s (repeat %d of %d)",
                    done,
                    total,
                    copies,
                    mode[0],
                    took,
                    f", {bad} failed" if bad else "",
                    repeat + 1,
                    repeats,
                )
                runs.setdefault((copies, mode[0]), []).append(took)
                failed[(copies, mode[0])] = failed.get((copies, mode[0]), 0) + bad
    rows += [Calibration(c, m, runs[(c, m)], failed[(c, m)]) for c in counts for m, _, _ in MODES]
    if any(r.failed for r in rows):
        log.warning("calibrate: some copies failed: their logs are in %s", bench.directory)
        return 0
    for path in bench.created:
        shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):  # the directory, if calibrate made it and it is empty
        if not bench.existed:
            os.rmdir(bench.directory)
    return 0


def _report(rows: Sequence[Calibration], as_json: bool, plot: str | None) -> None:
    best = recommend(rows)
    auto = auto_choice(rows)
    sliced = {r.copies: r.throughput for r in rows if r.mode == "time-sliced"}
    if as_json:
        data = [{**asdict(r), "median": r.median, "throughput": r.throughput} for r in rows]
        chosen = best and {**asdict(best), "throughput": best.throughput}
        print(
            json.dumps(
                {"rows": data, "recommended": chosen, "best": chosen, "auto": _auto_json(auto)},
                indent=1,
            )
        )
    else:
        print(
            f"{'copies':>6}  {'mode':<12} {'median s':>9} {'spread s':>9} {'copies/s':>9}"
            f" {'vs sliced':>9} {'failed':>6}"
        )
        for r in rows:
            spread = max(r.seconds) - min(r.seconds)
            gain = r.throughput / sliced[r.copies] if sliced.get(r.copies) else 0.0
            print(
                f"{r.copies:>6}  {r.mode:<12} {r.median:>9.2f} {spread:>9.2f} "
                f"{r.throughput:>9.3f} {gain:>8.2f}x {r.failed:>6}"
            )
        print(_advice(best, sliced))
        if best is not None and auto is not None:
            print(_auto_advice(best, auto[0]))
    if plot:
        _plot(rows, plot)


def _advice(best: Calibration | None, sliced: dict[int, float]) -> str:
    if best is None:
        return "calibrate: no MPS configuration ran cleanly: no recommendation"
    threads = "oversubscribe" if best.mode == "mps-200/n" else "none"
    top_sliced = max(sliced.values(), default=0.0)
    if top_sliced and best.throughput < top_sliced:
        return _no_mps(best, sliced)
    gain = f", {best.throughput / top_sliced:.2f}x the best time-sliced" if top_sliced else ""
    return (
        f"recommended: mpswrap farm --per-gpu {best.copies} --threads {threads} "
        f"({best.throughput:.3f} copies/s{gain})"
    )


def _no_mps(best: Calibration, sliced: dict[int, float]) -> str:
    """MPS loses to time-slicing on these figures: say so, and what to run instead."""
    copies, rate = max(sliced.items(), key=lambda kv: kv[1])
    return (
        f"recommended: no MPS: {copies} copies at once time-sliced did {rate:.3f} copies/s, "
        f"the best under MPS {best.throughput:.3f} ({best.throughput / rate:.2f}x: MPS loses "
        f"here); run {copies} at a time without mpswrap (e.g. parallel -j {copies}), or "
        f"mpswrap farm --per-gpu {best.copies} --threads "
        f"{'oversubscribe' if best.mode == 'mps-200/n' else 'none'} where MPS is wanted anyway"
    )


def _auto_json(auto: tuple[Calibration, Packing] | None) -> dict[str, Any] | None:
    if auto is None:
        return None
    row, walk = auto
    return {
        "copies": row.copies,
        "mode": row.mode,
        "throughput": row.throughput,
        "margin": MARGIN,
        "history": [c.to_json() for c in walk.history],
    }


def _auto_advice(best: Calibration, auto: Calibration) -> str:
    share = auto.throughput / best.throughput if best.throughput else 0.0
    return (
        f"auto: mpswrap farm (--per-gpu auto) would settle at K {auto.copies} on these figures "
        f"({auto.throughput:.3f} copies/s, {share:.2f} of the best)"
    )


def _plot(rows: Sequence[Calibration], path: str) -> None:
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, _, _ in MODES:
        mine = [r for r in rows if r.mode == mode]
        ax.plot([r.copies for r in mine], [r.throughput for r in mine], marker="o", label=mode)
    ax.set_xlabel("copies at once on one GPU")
    ax.set_ylabel("copies finished per second")
    ax.set_xscale("log", base=2)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    plots.save(fig, path)
    print(f"calibrate: plot saved to {path}")
