"""The task farm against hand-written waves, and --per-gpu auto against fixed K (issues 33, 44).

Everything side by side in one visit to the GPU machine. Issue 44's run (auto against the fixed
K around the best, on the three sets; ratios and OOM counts at the end), resumable with the same
``--out`` where one 10-minute call does not finish it:

    python benchmarks/farm_bench.py --out benchmarks/results/DATE-h100-farm-auto-44.json \
        --parts light,hetero,memory --modes auto,auto-known,fixed --fixed-k 8,16 --mem-k 3,16 \
        --repeats 3

Three task sets on GPU 0, each run every way in ``--modes``, ``--repeats`` times, the order
rotated each repeat (interleaved), makespan from the command's start to its end (the daemon's
start and teardown included):

- ``light``: ``--light`` small MLP trainings (``workers/mlp_task.py``, ``--steps``);
- ``hetero``: ``--hetero L,H`` of them, H of them ``--heavy-steps`` long, spread evenly;
- ``memory``: ``--memory`` tasks of ``workers/mem_task.py`` each holding ``--gib`` GiB for
  ``--hold`` s: the sum of their peaks is about 3x an 80 GB H100 (3 fit at once, 4 do not:
  22 GiB leaves room for the MPS contexts beside 3 of them).

Modes: ``auto`` (``mpswrap farm --per-gpu auto`` of commands it has not seen: no farm
profile to start from, ``taskfarm.profile``); ``auto-known`` (the same, starting from the
profile the set's last ``auto`` run wrote, ``<out>.profiles/<set>.json``: a farm of known
commands; in the first repeat it runs after ``auto``); ``fixed`` (``--per-gpu K``: light and
hetero at the best K, that of this file's ``calibrate`` record if the part ran, else
``--best-k``; memory at each K of ``--mem-k``); ``default`` (today's default K, entry/farm.py
``default_per_gpu``: a CPU per task, at most 16; run once where it equals a fixed K); ``waves``
(light and hetero: waves of the best K under a daemon started by hand, ``&`` and ``wait``).
Each farm's ``farm status --json`` is kept (counts, ``oom``, ``packing``); the first auto farm
of ``hetero`` (``--plot-sets``) is also plotted (``farm status --plot``) into ``--plot-dir``
(default: beside ``--out``). ``farm_report.py`` prints the table and the issue's ratios; it
runs at the end.

Budget (H100, 2026-11-24 record: a light task alone 9.75 s, of which about 2 s is training
and the rest PyTorch's import and CUDA's start-up; 16 at once under MPS 12.2 s, 1.31 tasks/s;
so a run costs about tasks / 1.31 s at K=16, plus 2 s for the daemon):

| set (default sizes) | auto | fixed | default | waves | a repeat |
|---|---|---|---|---|---|
| light, 40 tasks | ~44 s | ~42 s (K=16) | = fixed | ~41 s | ~130 s |
| hetero, 18 + 4 of 12,000 steps (~20 s alone) | ~30 s | ~25 s | = fixed | ~40 s | ~95 s |
| memory, 11 x 22 GiB held 3 s | ~40 s | ~36 s (K=3: 4 rounds) | ~12 s (fails) | - | ~90 s |

Three repeats of all three: about 1000 s (2026-11-25), more than one 10-minute call.
``--budget`` (s) stops before a run that would end past it (judged by the longest run of that
set so far); the same command again with the results file in place goes on where it stopped.
``--quick`` (light 16, hetero 10 + 2 of 8,000 steps, memory held 1 s): about 530 s in one
call, but light and hetero then fit in one wave of 16, so they tell little about auto's ramp.
The older parts (``alone``, ``serial``, ``compare``: farm vs waves vs serial; ``calibrate``)
are kept. Results append to ``--out`` (resumable: what is there is not run again).

    python benchmarks/farm_bench.py --out benchmarks/results/DATE-h100-farm.json
    python benchmarks/farm_bench.py --out F --parts calibrate,light,hetero --counts 8,12,16
    python benchmarks/farm_bench.py --out F --quick
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from farm_report import render  # noqa: E402
from revision import revision  # noqa: E402
from run import PY, Results, machine_meta, raw_mps, rotated  # noqa: E402

SETS = ("memory", "light", "hetero")
PARTS = (*SETS, "calibrate", "alone", "serial", "compare")
MODES = ("auto", "auto-known", "fixed", "default", "waves")
#: MPS's client limit on Volta and later: above the 16 of today's default, so never its bound.
CLIENT_LIMIT = 48
#: What calibrate recommended on the H100 (benchmarks/results/2026-11-24-h100-farm-59fb4ea.json).
KNOWN_BEST_K = 16
FARM_TIMEOUT = 180  # a farm that hangs must not take the whole 10-minute call


def task_argv(steps: int, seed: int | str) -> list[str]:
    return [PY, str(HERE / "workers" / "mlp_task.py"), "--steps", str(steps), "--seed", str(seed)]


def mem_argv(gib: float, seconds: float) -> list[str]:
    return [PY, str(HERE / "workers" / "mem_task.py"), "--gib", str(gib), "--seconds", str(seconds)]


@dataclass(frozen=True)
class Sizes:
    """The three task sets' sizes (the module's budget table)."""

    light: int = 40
    hetero_light: int = 18
    hetero_heavy: int = 4
    steps: int = 2000
    heavy_steps: int = 12000
    memory: int = 11
    gib: float = 22.0
    hold: float = 3.0


QUICK = Sizes(light=16, hetero_light=10, hetero_heavy=2, heavy_steps=8000, hold=1.0)


def task_set(name: str, sizes: Sizes) -> list[list[str]]:
    """The command lines of one set, in the order the farm gets them."""
    if name == "light":
        return [task_argv(sizes.steps, seed) for seed in range(sizes.light)]
    if name == "memory":
        return [mem_argv(sizes.gib, sizes.hold) for _ in range(sizes.memory)]
    total = sizes.hetero_light + sizes.hetero_heavy
    heavy = {(2 * i + 1) * total // (2 * sizes.hetero_heavy) for i in range(sizes.hetero_heavy)}
    return [task_argv(sizes.heavy_steps if i in heavy else sizes.steps, i) for i in range(total)]


def _run_all(argvs: list[list[str]], env: dict[str, str], timeout: float) -> list[int]:
    procs = [subprocess.Popen(a, env=env, stdout=subprocess.DEVNULL) for a in argvs]
    return [p.wait(timeout=timeout) for p in procs]


def _check(codes: list[int]) -> None:
    if any(codes):
        raise RuntimeError(f"exit codes {codes}")


def serial(n: int, steps: int, tmp: Path) -> float:
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(tmp / "no-mps"))
    start = time.monotonic()
    for seed in range(n):
        _check(_run_all([task_argv(steps, seed)], env, 600))
    return time.monotonic() - start


def run_waves(argvs: list[list[str]], k: int, tmp: Path) -> dict[str, Any]:
    """Waves of K under a daemon started by hand: what a user writes with ``&`` and ``wait``."""
    start = time.monotonic()
    codes: list[int] = []
    with raw_mps(tmp) as mps_env:
        env = dict(os.environ, **mps_env)
        for first in range(0, len(argvs), k):
            codes += _run_all(argvs[first : first + k], env, 600)
    took = time.monotonic() - start
    failed = sum(1 for c in codes if c)
    return {"makespan_s": round(took, 3), "done": len(codes) - failed, "failed": failed}


def waves(n: int, k: int, steps: int, tmp: Path) -> float:
    run = run_waves([task_argv(steps, s) for s in range(n)], k, tmp)
    _check([1] * run["failed"])
    return float(run["makespan_s"])


def _mpswrap(
    *args: str, tmp: Path, timeout: float, **extra: str
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MPSWRAP_USER_RUN_DIR=str(tmp / "run"), **extra)
    argv = [PY, "-m", "mpswrap", *args]
    return subprocess.run(argv, env=env, text=True, capture_output=True, timeout=timeout)


def run_farm(
    argvs: list[list[str]],
    per_gpu: str,
    tmp: Path,
    plot: Path | None = None,
    profile: str = "off",
) -> dict[str, Any]:
    """``mpswrap farm --per-gpu PER_GPU`` of the lines, then its ``farm status --json`` (and
    ``--plot``): makespan, exit code, the status's counts and ``packing``. Tasks that fail are
    recorded, not raised (today's default fails on the memory set); a farm that refuses to run
    (exit 2) or leaves no status is raised. ``profile``: the ``farm_profile`` setting."""
    tasks, farm_dir = tmp / "tasks.txt", tmp / "farm"
    tasks.write_text("".join(shlex.join(a) + "\n" for a in argvs))
    args = ["--gpus", "0", "--per-gpu", per_gpu, "--progress", "off", "--dir", str(farm_dir)]
    start = time.monotonic()
    res = _mpswrap(
        "farm", *args, str(tasks), tmp=tmp, timeout=FARM_TIMEOUT, MPSWRAP_FARM_PROFILE=profile
    )
    took = time.monotonic() - start
    status = _mpswrap("farm", "status", "--json", str(farm_dir), tmp=tmp, timeout=60)
    if res.returncode == 2 or status.returncode:
        raise RuntimeError(
            f"farm --per-gpu {per_gpu} exit {res.returncode}: {res.stderr[-2000:]}\n"
            f"farm status exit {status.returncode}: {status.stderr[-2000:]}"
        )
    record = json.loads(status.stdout)
    out: dict[str, Any] = {"makespan_s": round(took, 3), "exit_code": res.returncode}
    out.update({k: record.get(k) for k in ("tasks", "done", "failed", "oom", "not_run")})
    if record.get("packing"):
        out["packing"] = record["packing"]
    if plot:
        out.update(_plot(farm_dir, plot, record, tmp))
    return out


def _plot(farm_dir: Path, plot: Path, record: dict[str, Any], tmp: Path) -> dict[str, str]:
    """``farm status --plot``, and the status record beside it (to plot again elsewhere); a
    plot that fails (no matplotlib there) is recorded, never the end of the benchmark."""
    plot.parent.mkdir(parents=True, exist_ok=True)
    plot.with_suffix(".json").write_text(json.dumps(record, indent=1))
    drawn = _mpswrap("farm", "status", "--plot", str(plot), str(farm_dir), tmp=tmp, timeout=60)
    if drawn.returncode:
        return {"plot_error": drawn.stderr.strip()[-500:]}
    return {"plot": plot.name}


def farm(n: int, k: int, steps: int, tmp: Path) -> float:
    run = run_farm([task_argv(steps, s) for s in range(n)], str(k), tmp)
    if run["exit_code"]:
        raise RuntimeError(f"farm exit {run['exit_code']}")
    return float(run["makespan_s"])


def _fresh() -> Path:
    return Path(tempfile.mkdtemp(prefix="mpsf-", dir="/tmp"))


def measure(res: Results, key: str, what: str, fn: object, *args: object) -> None:
    if res.has(key):
        return
    tmp = _fresh()
    try:
        took = fn(*args, tmp)  # type: ignore[operator]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res.add(key, {"what": what, "makespan_s": round(took, 3)})


def calibrate(res: Results, steps: int, counts: str, repeats: int) -> None:
    if res.has("calibrate"):
        return
    tmp = _fresh()
    try:
        argv = ["calibrate", "--gpus", "0", "--counts", counts, "--repeats", str(repeats)]
        argv += ["--json", "--dir", str(tmp / "cal"), "--", *task_argv(steps, "$MPSWRAP_TASK")[:-2]]
        out = _mpswrap(*argv, tmp=tmp, timeout=1800)
        if out.returncode:
            raise RuntimeError(f"calibrate exit {out.returncode}: {out.stderr[-2000:]}")
        report = json.loads(out.stdout)
        res.add(
            "calibrate",
            {"what": "calibrate", "counts": counts, "repeats": repeats, "report": report},
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- issue 33: auto against fixed K ------------------------------------------------------
def calibrated_k(res: Results) -> int | None:
    """The K of this file's calibrate record: ``best`` (or ``recommended``, its older name)."""
    cal = next((r for r in res.data["runs"] if r["key"] == "calibrate"), None)
    if cal is None:
        return None
    best = cal["report"].get("best") or cal["report"].get("recommended")
    if isinstance(best, dict):
        best = best.get("copies", best.get("k"))
    return int(best) if best else None


def today_default_k() -> int:
    """K of ``mpswrap farm`` without ``--per-gpu`` before auto: entry/farm.py's rule."""
    from mpswrap.taskfarm.sizing import default_per_gpu

    return int(default_per_gpu(CLIENT_LIMIT, 1, len(os.sched_getaffinity(0))))


def variants(
    name: str,
    modes: list[str],
    best: int,
    default: int,
    mem_ks: list[int],
    fixed_ks: list[int] | None = None,
) -> list[tuple[str, int | None]]:
    """(mode, K) pairs of a set; ``default`` where it is a fixed K already is run once.
    ``fixed_ks``: the fixed K of light and hetero (``--fixed-k``; default: the best K)."""
    fixed = mem_ks if name == "memory" else (fixed_ks or [best])
    out: list[tuple[str, int | None]] = []
    for mode in modes:
        if mode in ("auto", "auto-known"):
            out.append((mode, None))
        elif mode == "fixed":
            out += [("fixed", k) for k in fixed]
        elif mode == "default" and not ("fixed" in modes and default in fixed):
            out.append(("default", default))
        elif mode == "waves" and name != "memory":
            out.append(("waves", best))
    return out


def _run_way(
    plan: SetPlan, mode: str, k: int | None, tmp: Path, plot: Path | None
) -> dict[str, Any]:
    """One run of a set one way. ``auto`` starts from no profile and leaves what it learned
    as the set's profile; ``auto-known`` starts from a copy of that."""
    if mode == "waves":
        return run_waves(plan.argvs, int(k or 1), tmp)
    if k is not None:
        return run_farm(plan.argvs, str(k), tmp, plot)
    profile = tmp / "profile.json"
    if mode == "auto-known":
        shutil.copyfile(plan.profile, profile)
    run = run_farm(plan.argvs, "auto", tmp, plot, profile=str(profile))
    if mode == "auto" and profile.exists():
        plan.profile.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(profile, plan.profile)
    return run


def set_key(name: str, mode: str, k: int | None, rep: int) -> str:
    return f"{name}/{mode}{'' if k is None else f'-k{k}'}/r{rep}"


class Clock:
    """The budget: a run starts only if the longest of its set so far still fits."""

    def __init__(self, budget: float) -> None:
        self.deadline = time.monotonic() + budget
        self.longest: dict[str, float] = {}

    def allows(self, name: str) -> bool:
        return time.monotonic() + self.longest.get(name, 30.0) <= self.deadline

    def took(self, name: str, seconds: float) -> None:
        self.longest[name] = max(seconds, self.longest.get(name, 0.0))


@dataclass(frozen=True)
class SetPlan:
    name: str
    argvs: list[list[str]]
    variants: list[tuple[str, int | None]]
    repeats: int
    plot: Path | None  # where the first auto farm is plotted (hetero)
    #: What the set's last ``auto`` run learned (its farm profile), for ``auto-known``.
    profile: Path


def phase_set(res: Results, plan: SetPlan, clock: Clock) -> bool:
    """Every variant of one set, ``repeats`` times interleaved; False when the budget ran out."""
    for rep in range(plan.repeats):
        order = list(rotated(tuple(plan.variants), rep))
        if rep == 0:  # auto-known starts from what an auto run learned
            order.sort(key=lambda v: v[0] == "auto-known")
        for mode, k in order:
            key = set_key(plan.name, mode, k, rep)
            if res.has(key):
                continue
            if mode == "auto-known" and not plan.profile.exists():
                print(
                    f"{key}: not run: no profile from an auto run of this set "
                    f"({plan.profile}); it runs once an auto run of this --out leaves one",
                    flush=True,
                )
                continue
            if not clock.allows(plan.name):
                return False
            plot = plan.plot if mode == "auto" and not _plotted(res, plan.name) else None
            tmp = _fresh()
            try:
                run = _run_way(plan, mode, k, tmp, plot)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            clock.took(plan.name, run["makespan_s"])
            res.add(
                key,
                {
                    "what": "set",
                    "set": plan.name,
                    "mode": mode,
                    "k": k,
                    "rep": rep,
                    "tasks": len(plan.argvs),
                    **run,
                },
            )
    return True


def _plotted(res: Results, name: str) -> bool:
    return any(
        r.get("set") == name and ("plot" in r or "plot_error" in r) for r in res.data["runs"]
    )


def best_k(res: Results, given: int | None) -> tuple[int, str]:
    """The fixed K that light and hetero compare auto with, and where it came from."""
    if given is not None:
        return given, "--best-k"
    calibrated = calibrated_k(res)
    if calibrated is not None:
        return calibrated, "this file's calibrate record"
    return KNOWN_BEST_K, "calibrate on the H100, 2026-11-24 (2026-11-24-h100-farm-59fb4ea.json)"


def _part(res: Results, part: str, args: argparse.Namespace, sizes: Sizes, clock: Clock) -> bool:
    n, k, steps = args.tasks, args.per_gpu, sizes.steps
    if part == "alone":
        for rep in range(3):
            measure(res, f"alone-{rep}", "alone", serial, 1, steps)
    elif part == "serial":
        measure(res, "serial", "serial", serial, n, steps)
    elif part == "compare":
        for rep in range(args.repeats):
            order = [("rawmps-waves", waves), ("farm", farm)]
            for name, fn in order if rep % 2 == 0 else order[::-1]:
                measure(res, f"{name}-{rep}", name, fn, n, k, steps)
    elif part == "calibrate":
        calibrate(res, steps, args.counts, args.calibrate_repeats)
    else:
        best, source = best_k(res, args.best_k)
        default = args.default_k or today_default_k()
        mem_ks = [int(x) for x in args.mem_k.split(",")]
        fixed_ks = [int(x) for x in args.fixed_k.split(",")] if args.fixed_k else None
        res.data["meta"].update(best_k=best, best_k_from=source, default_k=default, mem_k=mem_ks)
        res.data["meta"]["sizes"] = asdict(sizes)
        plot = args.plot_dir / f"farm-auto-{part}.png" if part in args.plot_sets else None
        modes = args.modes.split(",")
        plan = SetPlan(
            part,
            task_set(part, sizes),
            variants(part, modes, best, default, mem_ks, fixed_ks),
            args.repeats,
            plot,
            args.out.with_name(f"{args.out.stem}.profiles") / f"{part}.json",
        )
        return phase_set(res, plan, clock)
    return True


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default=",".join(SETS), help="of " + ",".join(PARTS))
    ap.add_argument("--modes", default=",".join(MODES), help="of " + ",".join(MODES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=530, help="seconds before stopping")
    ap.add_argument("--quick", action="store_true", help="smaller sets: one call (see above)")
    for field in Sizes.__dataclass_fields__:
        if field not in ("hetero_light", "hetero_heavy"):
            kind = float if field in ("gib", "hold") else int
            ap.add_argument(f"--{field.replace('_', '-')}", type=kind, default=None)
    ap.add_argument("--hetero", default=None, metavar="L,H", help="light and heavy tasks")
    ap.add_argument("--best-k", type=int, default=None, help="fixed K for light and hetero")
    ap.add_argument("--default-k", type=int, default=None, help="today's default (computed)")
    ap.add_argument("--mem-k", default="3", help="fixed K for the memory set (e.g. 2,3)")
    ap.add_argument("--fixed-k", default=None, help="fixed K for light and hetero (e.g. 8,16)")
    ap.add_argument("--plot-dir", type=Path, default=None, help="default: --out's directory")
    ap.add_argument("--plot-sets", default="hetero", help="sets whose first auto farm is plotted")
    ap.add_argument("--tasks", type=int, default=48, help="compare/serial: tasks")
    ap.add_argument("--per-gpu", type=int, default=12, help="compare: K")
    ap.add_argument("--counts", default="1,2,4,8,12,16", help="calibrate's counts")
    ap.add_argument("--calibrate-repeats", type=int, default=2)
    return ap


def _sizes(args: argparse.Namespace) -> Sizes:
    sizes = QUICK if args.quick else Sizes()
    given = {f: getattr(args, f) for f in Sizes.__dataclass_fields__ if hasattr(args, f)}
    sizes = replace(sizes, **{f: v for f, v in given.items() if v is not None})
    if args.hetero:
        light, heavy = (int(x) for x in args.hetero.split(","))
        sizes = replace(sizes, hetero_light=light, hetero_heavy=heavy)
    return sizes


def main() -> int:
    args = _parser().parse_args()
    parts, modes = args.parts.split(","), args.modes.split(",")
    for given, known in ((parts, PARTS), (modes, MODES)):
        if set(given) - set(known):
            sys.exit(f"farm_bench: unknown: {', '.join(sorted(set(given) - set(known)))}")
    if "auto-known" in modes and "auto" not in modes:
        sys.exit("farm_bench: auto-known starts from what an auto run learned: add auto")
    args.plot_dir = args.plot_dir or args.out.parent
    sizes = _sizes(args)
    res = Results(args.out)
    res.data["meta"] = {
        **machine_meta(),
        **revision(),
        "tasks": args.tasks,
        "per_gpu": args.per_gpu,
        "steps": sizes.steps,
        "budget_s": args.budget,
    }
    clock = Clock(args.budget)
    done = True
    for part in parts:  # in the order given: what matters most first, where time is short
        done = _part(res, part, args, sizes, clock) and done
    if not done:
        print("budget reached; run again with the same --out to fill the gaps", flush=True)
    print(render(res.data), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
