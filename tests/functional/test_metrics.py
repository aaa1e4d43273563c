"""``mpswrap status`` per client and ``mpswrap metrics`` on the simulator: the documented fields
and series, parsed with prometheus_client; the textfile replaced whole while a reader reads."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mpswrap.mps import gpu
from mpswrap.mps.control import CLIENT_FIELDS
from mpswrap.paths import GpuDirs
from mpswrap.report import metrics
from tests.procs import ended, interruptible, signal_tree
from tests.promcheck import exposition_problems
from tests.simenv import SimNode
from tests.tree import REPO
from tests.waits import wait_until

pytestmark = pytest.mark.functional


@pytest.fixture
def job(node: SimNode) -> Iterator[list[subprocess.Popen[str]]]:
    """Job ``met`` with its daemons and three clients on g0: ranks 0-2, thread shares 10/20/30."""
    assert node.run("start", "--job", "met").returncode == 0
    g0 = node.started("met")
    clients = [
        subprocess.Popen(
            [node.client, "--seconds", "60"],
            text=True,
            env=node.env(
                OMPI_COMM_WORLD_RANK="abc",  # malformed, and outranked by MPSWRAP_RANK: harmless
                CUDA_MPS_PIPE_DIRECTORY=str(g0.pipe),
                CUDA_MPS_LOG_DIRECTORY=str(g0.log),
                CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(10 * (r + 1)),
                MPSWRAP_RANK=str(r),
                CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=f"0={r + 1}G",
            ),
        )
        for r in range(3)
    ]
    try:
        _listed_in(node, "met", 3)
        yield clients
    finally:
        for c in clients:
            c.kill()
            c.wait()
        assert node.run("stop", "--job", "met").returncode == 0


def _status(node: SimNode) -> dict[str, Any]:
    out = node.run("status", "--job", "met", "--json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_status_shows_each_client(node: SimNode, job: list[subprocess.Popen[str]]) -> None:
    clients = _status(node)["jobs"][0]["gpus"][0]["servers"][0]["clients"]
    assert all(set(c) == set(CLIENT_FIELDS) for c in clients), clients  # as reference.md says
    by_pid = {c["pid"]: c for c in clients}
    for rank, proc in enumerate(job):
        mine = by_pid[proc.pid]
        assert (mine["rank"], mine["active_thread_percentage"]) == (rank, 10.0 * (rank + 1))
        assert mine["pinned_mem_limit"] == f"0={rank + 1}G" and mine["user"]
        assert mine["task"] is None, "not a farm's"
        assert mine["uptime_s"] >= 0 and "mpswrap.sim.client" in mine["cmdline"]
        assert mine["gpu_memory_bytes"] is None, "the simulator has no NVML"


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _samples(families: dict[str, Any], name: str) -> list[Any]:
    return list(families[name].samples) if name in families else []


def test_metrics_parse_and_carry_every_family(
    node: SimNode, job: list[subprocess.Popen[str]]
) -> None:
    out = node.run("metrics", "--job", "met")
    assert out.returncode == 0, out.stderr
    assert exposition_problems(out.stdout) == []
    families = _families(out.stdout)
    # The parser names a counter's family without its _total, as Prometheus does.
    assert set(families) == {
        f.name.removesuffix("_total") if f.kind == "counter" else f.name for f in metrics.FAMILIES
    }
    for family in metrics.FAMILIES:  # each series has exactly its family's labels
        name = family.name.removesuffix("_total") if family.kind == "counter" else family.name
        assert all(set(s.labels) == set(family.labels) for s in families[name].samples), name
    clients = families["mpswrap_clients"].samples
    assert sorted((s.labels["rank"], s.labels["task"], s.value) for s in clients) == [
        ("0", "", 1.0),
        ("1", "", 1.0),
        ("2", "", 1.0),
    ]
    assert all(s.labels["job_id"] == "met" and s.labels["gpu"] == "g0" for s in clients)
    shares = {
        s.labels["rank"]: s.value for s in families["mpswrap_client_active_thread_ratio"].samples
    }
    assert shares == {"0": 0.1, "1": 0.2, "2": 0.3}
    started = {
        int(s.labels["rank"]): s.value
        for s in families["mpswrap_client_start_time_seconds"].samples
    }
    assert all(0 < time.time() - t < 120 for t in started.values()) and len(started) == 3
    up = {s.labels["gpu"]: s.value for s in families["mpswrap_daemon_up"].samples}
    assert up == {"g0": 1.0, "g1": 1.0}
    servers = [
        (s.labels["gpu"], s.labels["state"], s.value) for s in families["mpswrap_servers"].samples
    ]
    assert servers == [("g0", "ACTIVE", 1.0)]
    assert [s.value for s in families["mpswrap_server_active_thread_ratio"].samples] == [1.0]
    assert families["mpswrap_faults"].type == "gauge"  # recounted from the log: may go down
    assert families["mpswrap_client_info"].samples == [], "pid and command only when asked"
    without_nvml = {
        "mpswrap_client_gpu_memory_bytes",
        "mpswrap_gpu_memory_used_bytes",
        "mpswrap_gpu_utilization_ratio",
    }
    not_here = {"mpswrap_client_info", "mpswrap_programs_ended"}  # nothing run, nothing ended
    empty = [n for n, f in families.items() if not f.samples and n not in without_nvml | not_here]
    assert empty == [], empty


def test_build_info_names_this_mpswrap_and_its_python(node: SimNode) -> None:
    """``mpswrap_build_info``: one series of value 1, labelled as prometheus_client's
    ``python_info`` is, written also where no job runs (which mpswrap a node runs)."""
    import platform

    from mpswrap import __version__

    out = node.run("metrics", "--job", "nothing-here")
    assert out.returncode == 0, out.stderr
    assert exposition_problems(out.stdout) == []
    samples = _samples(_families(out.stdout), "mpswrap_build_info")
    assert [(s.labels, s.value) for s in samples] == [
        ({"version": __version__, "python": platform.python_version()}, 1.0)
    ]
    line = f'mpswrap_build_info{{version="{__version__}",python="{platform.python_version()}"}} 1'
    assert line in out.stdout.splitlines(), out.stdout


def test_process_labels_only_when_asked(node: SimNode, job: list[subprocess.Popen[str]]) -> None:
    out = node.run("metrics", "--job", "met", "--process-labels")
    assert out.returncode == 0, out.stderr
    assert exposition_problems(out.stdout, process_labels=True) == []
    families = _families(out.stdout)
    info = families["mpswrap_client_info"].samples
    assert sorted((s.labels["pid"], s.labels["rank"]) for s in info) == sorted(
        (str(p.pid), str(r)) for r, p in enumerate(job)
    )
    assert all("mpswrap.sim.client" in s.labels["command"] for s in info)
    per_pid = {s.labels["pid"]: s.value for s in families["mpswrap_clients"].samples}
    assert per_pid == {str(p.pid): 1.0 for p in job}
    assert all("command" not in s.labels for s in families["mpswrap_clients"].samples)


def test_the_textfile_is_never_read_half_written(
    node: SimNode, job: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    text = node.run("metrics", "--job", "met").stdout * 50  # large: a torn read would show
    seen: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                seen.append((tmp_path / "mpswrap.prom").read_text())
            except FileNotFoundError:
                continue

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(200):
            metrics.write_textfile(tmp_path, text if i % 2 else text[: len(text) // 2])
    finally:
        stop.set()
        reader.join()
    assert seen and all(s in (text, text[: len(text) // 2]) for s in seen)
    assert [p.name for p in tmp_path.iterdir()] == ["mpswrap.prom"]
    assert (tmp_path / "mpswrap.prom").stat().st_mode & 0o777 == 0o644
    out = node.run("metrics", "--job", "met", "--textfile", str(tmp_path / "none"))
    assert out.returncode == 2 and "--textfile needs an existing directory" in out.stderr


def test_nvml_figures_prefer_the_mps_view(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each client's memory from NVML's MPS-aware list where it has one, else the plain one."""

    class Proc:
        def __init__(self, pid: int, used: int | None) -> None:
            self.pid, self.usedGpuMemory = pid, used

    class Nvml:
        def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
            return uuid

        def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
            return type("M", (), {"used": 5 << 30, "total": 80 << 30})()

        def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
            return type("U", (), {"gpu": 37})()

        def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Proc]:
            return [Proc(10, 1 << 30), Proc(11, None), Proc(12, 7)]

        def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: str) -> list[Proc]:
            return [Proc(11, 2 << 30), Proc(12, 4 << 30)]

    monkeypatch.setattr(gpu, "init_nvml", Nvml)
    found = gpu.usage("GPU-x", "nvml")
    assert found == {
        "memory_used_bytes": 5 << 30,
        "memory_total_bytes": 80 << 30,
        "utilization_percent": 37,
        "processes": {10: 1 << 30, 11: 2 << 30, 12: 4 << 30},
    }
    assert gpu.usage("GPU-x", "/tmp/gpus.json") is None


def _clients(node: SimNode, g0: GpuDirs, extra: list[list[str]]) -> list[subprocess.Popen[str]]:
    env = node.env(CUDA_MPS_PIPE_DIRECTORY=str(g0.pipe), CUDA_MPS_LOG_DIRECTORY=str(g0.log))
    return [
        subprocess.Popen(
            [node.client, *args],
            env=env,
            text=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for args in extra
    ]


def test_a_job_record_says_who_ran_how_each_ended_and_the_fault(
    node: SimNode, tmp_path: Path
) -> None:
    archive = tmp_path / "archive"
    archive.mkdir()
    old = archive / "n9-1-g0-record.json"
    old.write_text("{}")
    os.utime(old, (time.time() - 40 * 86400,) * 2)  # past log_archive_days (30)
    (archive / "notes.txt").write_text("an admin's file")
    assert node.run("start", "--job", "rec", MPSWRAP_LOG_ARCHIVE=str(archive)).returncode == 0
    g0 = node.started("rec")
    faulty = _clients(node, g0, [["--seconds", "60", "--fault-after", "0.3"]])
    faulty[0].wait(timeout=30)  # the fault ends the clients of that server, this one first
    clients = _clients(node, g0, [["--seconds", "60"]] * 4)
    try:
        _listed_in(node, "rec", 4)
        assert node.run("stop", "--job", "rec", MPSWRAP_LOG_ARCHIVE=str(archive)).returncode == 0
    finally:
        for c in clients:
            c.wait(timeout=30)
    out = node.run("report", "rec", "--json", MPSWRAP_LOG_ARCHIVE=str(archive))
    assert out.returncode == 0, out.stderr
    records = json.loads(out.stdout)
    # Oldest first: the GPUs' teardowns run side by side, so either may have ended first.
    by_gpu = {r["gpu"]: r for r in records}
    assert len(records) == 2 and sorted(by_gpu) == ["g0", "g1"], records
    rec = by_gpu["g0"]
    pids = sorted(c.pid for c in clients)
    assert rec["clients_seen_count"] == 5 and faulty[0].pid in rec["clients_seen"]
    assert sorted(rec["ended_by_terminate_client"] + rec["ended_with_server"]) == pids
    assert rec["killed"] == [] and rec["leftovers"] == []
    assert [f["reported_by"] for f in rec["faults"]] == [[faulty[0].pid]]
    assert rec["user"] and rec["gpu_uuid"].startswith("GPU-") and rec["job"] == "rec"
    text = node.run("report", "rec", MPSWRAP_LOG_ARCHIVE=str(archive))
    assert "5 client(s) seen" in text.stdout and "fault at" in text.stdout, text.stdout
    assert not old.exists() and (archive / "notes.txt").exists(), "pruned by age, ours only"
    assert sorted(p.name for p in archive.glob("*-rec-g0-*")) == [
        f"{g0.root.parent.parent.name}-rec-g0-{n}"
        for n in ("control.log", "record.json", "server.log")
    ]
    none = node.run("report", "other", MPSWRAP_LOG_ARCHIVE=str(archive))
    assert none.returncode == 4 and "no record of job other" in none.stderr
    unset = node.run("report", "rec")
    assert unset.returncode == 2 and "no log_archive is set" in unset.stderr


def _listed_in(node: SimNode, job: str, k: int) -> None:
    for _ in range(100):
        out = json.loads(node.run("status", "--job", job, "--json").stdout)
        servers = out["jobs"][0]["gpus"][0].get("servers", [])
        if sum(len(s["clients"]) for s in servers) >= k:
            return
        time.sleep(0.1)
    raise AssertionError(f"{k} clients never listed")


def test_a_malformed_rank_or_odd_command_never_breaks_status_or_metrics(
    node: SimNode, job: list[subprocess.Popen[str]]
) -> None:
    g0 = node.started("met")
    odd = subprocess.Popen(
        [str(node.client), "--seconds", "60", "--tag", 'a"b\\c\nd\udcff'],
        text=True,
        env=node.env(
            CUDA_MPS_PIPE_DIRECTORY=str(g0.pipe),
            SLURM_PROCID="x1",
            MPSWRAP_TASK="7; rm -rf ~",
            CUDA_MPS_LOG_DIRECTORY=str(g0.log),
        ),
        errors="surrogateescape",
    )
    try:
        _listed_in(node, "met", 4)
        status = node.run("status", "--job", "met", "--json")
        assert status.returncode == 0, status.stderr
        out = node.run("metrics", "--job", "met", "--process-labels")
        assert out.returncode == 0, out.stderr
        assert exposition_problems(out.stdout, process_labels=True) == []
        info = _families(out.stdout)["mpswrap_client_info"].samples
        mine = [s for s in info if s.labels["pid"] == str(odd.pid)]
        assert mine and (mine[0].labels["rank"], mine[0].labels["task"]) == ("", ""), mine
        assert 'a"b\\c\nd\\udcff' in mine[0].labels["command"], mine[0].labels["command"]
    finally:
        odd.kill()
        odd.wait()


def test_a_gpu_shared_by_two_jobs_and_one_job_id_twice_give_no_duplicate_series() -> None:
    gpu = {
        "key": "g0",
        "uuid": "GPU-1",
        "daemon": {"user": "u", "alive": True},
        "faults": [],
        "servers": [],
        "usage": {"memory_used_bytes": 5, "utilization_percent": 7},
    }
    jobs = [
        {"node": "n1", "job": j, "job_dir": d, "gpus": [gpu]}
        for j, d in (("1", "/run/m/n1/1"), ("2", "/run/m/n1/2"), ("1", "/tmp/u/n1/1"))
    ]
    text = metrics.render({"node": "n1", "jobs": jobs})
    assert exposition_problems(text) == []
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(samples) == len(set(samples))
    assert sum(line.startswith("mpswrap_gpu_memory_used_bytes") for line in samples) == 1
    assert sum(line.startswith("mpswrap_daemon_up") for line in samples) == 3


def test_pruning_removes_only_mpswrap_files_and_at_most_hourly(tmp_path: Path) -> None:
    from mpswrap.mps import record

    old = time.time() - 40 * 86400
    names = [
        "n1-5-g0-record.json",
        "n1-5-g0-server.log",
        "nginx-server.log",
        "x-record.json",
        "notes.txt",
    ]
    for name in names:
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (old, old))
    record.prune(tmp_path, 30)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".mpswrap-pruned", "nginx-server.log", "x-record.json", "notes.txt"]
    )
    (tmp_path / "n1-6-g1-control.log").write_text("x")
    os.utime(tmp_path / "n1-6-g1-control.log", (old, old))
    record.prune(tmp_path, 30)
    assert (tmp_path / "n1-6-g1-control.log").exists(), "pruned twice within the hour"
    record.prune(tmp_path, None)  # log_archive_days = none: kept forever


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_status_watch_refreshes_until_interrupted(
    node: SimNode, job: list[subprocess.Popen[str]], sig: signal.Signals
) -> None:
    """Ended by INT or TERM alike, the watch exits 128+N, as every command a signal ends."""
    with interruptible():
        watch = node.start("status", "--job", "met", "--watch", "0.2")
    heads, clients = 0, 0
    with ended(watch):
        assert watch.stdout is not None
        for line in watch.stdout:
            heads += line.startswith("--- ")
            clients += line.strip().startswith("client ")
            if heads == 3:
                break
        watch.send_signal(sig)
        _, err = watch.communicate(timeout=30)
    assert watch.returncode == 128 + sig, err
    assert "Traceback" not in err, err
    assert clients >= 2 * len(job), "each refresh lists the clients"
    bad = node.run("status", "--watch", "0")
    assert bad.returncode == 2 and "argument --watch: invalid value '0'" in bad.stderr


def test_all_shows_every_job_even_from_inside_another(
    node: SimNode, job: list[subprocess.Popen[str]]
) -> None:
    inside = node.run("status", "--json", SLURM_JOB_ID="4242")
    assert inside.returncode == 4 and json.loads(inside.stdout)["jobs"] == [], inside.stdout
    every = node.run("status", "--json", "--all", SLURM_JOB_ID="4242")
    assert [j["job"] for j in json.loads(every.stdout)["jobs"]] == ["met"], every.stdout
    metrics_all = node.run("metrics", "--all", SLURM_JOB_ID="4242")
    assert 'job_id="met"' in metrics_all.stdout, metrics_all.stdout


def _metrics_when(node: SimNode, job: str, ready: Any) -> dict[str, Any]:
    """The families of ``metrics --job JOB`` once ``ready(families)`` holds."""

    def look() -> dict[str, Any] | None:
        out = node.run("metrics", "--job", job)
        families = _families(out.stdout) if out.returncode == 0 else {}
        return families if families and ready(families) else None

    found: dict[str, Any] = wait_until(look, 60, f"the metrics of job {job}")
    return found


def _labels_of(families: dict[str, Any], name: str, *keys: str) -> list[tuple[str, ...]]:
    return sorted(tuple(s.labels[k] for k in keys) for s in _samples(families, name))


def test_a_farms_metrics_name_its_tasks_not_its_processes(node: SimNode) -> None:
    """Two tasks that end (0 and 1) and two that run: the running ones by task number, the
    ended ones counted by exit code (the run record); promtool passes."""
    tasks = node.root / "tasks.txt"
    tasks.write_text(f"true\nfalse\n{node.client} --seconds 60\n{node.client} --seconds 60\n")
    proc = node.start("farm", "--job", "fm", "--per-gpu", "2", str(tasks))
    try:
        families = _metrics_when(
            node,
            "fm",
            lambda f: (
                len(_samples(f, "mpswrap_clients")) == 2
                and len(_samples(f, "mpswrap_programs_ended")) == 2
            ),
        )
        text = node.run("metrics", "--job", "fm").stdout
        assert exposition_problems(text) == []
        assert _labels_of(families, "mpswrap_clients", "task", "rank") == [("2", ""), ("3", "")]
        ended = {
            s.labels["exit_code"]: s.value for s in _samples(families, "mpswrap_programs_ended")
        }
        assert ended == {"0": 1.0, "1": 1.0}
        assert families["mpswrap_programs_ended"].type == "counter"
    finally:
        signal_tree(proc, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err


def test_a_runs_metrics_name_its_ranks_not_its_processes(node: SimNode) -> None:
    program = [node.client, "--seconds", "60"]
    proc = node.start("run", "-n", "3", "--job", "rn", "--grace", "5", "--", *program)
    try:
        families = _metrics_when(node, "rn", lambda f: len(_samples(f, "mpswrap_clients")) == 3)
        text = node.run("metrics", "--job", "rn").stdout
        assert exposition_problems(text) == []
        assert _labels_of(families, "mpswrap_clients", "gpu", "rank", "task") == [
            ("g0", "0", ""),
            ("g0", "1", ""),
            ("g1", "2", ""),
        ]
    finally:
        signal_tree(proc, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, err


def test_the_dashboards_queries_are_promql(tmp_path: Path) -> None:
    """promtool parses every query of docs/grafana-mpswrap.json, its variables filled in
    (tests/unit/test_grafana_dashboard.py checks the names in them)."""
    dashboard = json.loads((REPO / "docs" / "grafana-mpswrap.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    filled = {"$__rate_interval": "5m", "$node": ".*", "$job_id": ".*"}
    for var, value in filled.items():
        exprs = [e.replace(var, value) for e in exprs]
    assert exprs and not [e for e in exprs if "$" in e], exprs
    rules = tmp_path / "dashboard-rules.yml"  # JSON is YAML
    rules.write_text(
        json.dumps(
            {
                "groups": [
                    {
                        "name": "dashboard",
                        "rules": [{"record": f"q:{i}", "expr": e} for i, e in enumerate(exprs)],
                    }
                ]
            }
        )
    )
    promtool = shutil.which("promtool")
    assert promtool, "promtool is needed: apt-get install prometheus (tools/test.sh does)"
    res = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in res.stdout, res.stdout


def test_exit_codes_of_the_run_record_are_bounded_labels() -> None:
    """The run record is the job user's: a forged code list must not mint a series per
    number in root's metrics. Codes 0-255 are their own label value, any other is "other"."""
    from mpswrap.report.metrics import render

    job: dict[str, Any] = {"node": "n1", "job": "7", "job_dir": "/r/7", "gpus": []}
    job["runs"] = {"exit_codes": {"0": 3, "137": 1, "1000": 2, "-5": 1, "99999": 4}}
    text = render({"node": "n1", "jobs": [job]})
    found = sorted(ln for ln in text.splitlines() if ln.startswith("mpswrap_programs_ended"))
    assert [ln.split("exit_code=")[1] for ln in found] == ['"0"} 3', '"137"} 1', '"other"} 7']
