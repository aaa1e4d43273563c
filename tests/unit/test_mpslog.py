"""mpslog against a server.log excerpt written by the real driver (H100, driver 580.159.04,
2026-11-23): one client made an illegal memory access while three others ran."""

from __future__ import annotations

from pathlib import Path

from mpswrap.mps import mpslog

H100_FAULT = Path(__file__).parent / "data" / "h100-fault-server.log"


def test_a_real_fault_names_every_client_and_ends_when_the_server_context_goes() -> None:
    (fault,) = mpslog.read_faults(H100_FAULT)
    assert fault.server_pid == 921
    assert fault.time == "2026-11-23 11:12:52.264"
    # 936 made the illegal access; the server named 916, a bystander, as the one that met it.
    assert fault.reported_by == [916]
    assert fault.affected == [915, 936, 917, 916]
    assert fault.recovered


def test_a_fault_still_being_handled_is_not_recovered(tmp_path: Path) -> None:
    lines = H100_FAULT.read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if "Destroy server context" in line)
    partial = tmp_path / "server.log"
    partial.write_text("\n".join(lines[:cut]) + "\n")
    (fault,) = mpslog.read_faults(partial)
    assert fault.affected == [915, 936, 917, 916]
    assert not fault.recovered


def test_a_log_of_millions_of_lines_is_read_by_its_last_lines_only(tmp_path: Path) -> None:
    """8 MiB of line ends (``\\n``, ``\\r``, ``\\r\\n``) after a fault: at most
    ``LINES_LIMIT`` lines are parsed, the last ones, so what the log's end says is kept."""
    fault = (
        "[2026-11-23 11:12:52.264 Other 921] Client {PID: 916, Context ID: 1} encountered a fatal"
    )
    done = "[2026-11-23 11:12:53.000 Other 921] Client termination succeeded"
    for ending in ("\n", "\r", "\r\n"):
        log = tmp_path / "server.log"
        log.write_bytes(f"{fault}\n".encode() + ending.encode() * (4 << 20) + f"{done}\n".encode())
        read = mpslog.MpsLog.read(log)
        assert len(read.lines) == mpslog.LINES_LIMIT
        assert read.terminations() == 1 and read.faults() == []


def test_the_last_lines_of_a_short_log_are_all_of_it() -> None:
    assert mpslog._last_lines("a\r\nb\rc\n", 2) == ["b", "c"]
    assert mpslog._last_lines("a\nb", 5) == ["a", "b"]
    assert mpslog._last_lines("", 5) == []
    assert mpslog._last_lines("x" * 5000, 1) == ["x" * mpslog.LINE_LIMIT]


def test_status_past_its_deadline_reads_no_log_of_the_job_users(tmp_path: Path) -> None:
    """Root's ``status`` gives the whole node one deadline: a daemon it reaches after that
    is "not answered in time", its server.log (the job user's, any size) left unread."""
    from mpswrap import _wait
    from mpswrap.config import load_settings
    from mpswrap.mps.daemon import NOT_IN_TIME, Daemon
    from mpswrap.paths import GpuDirs

    dirs = GpuDirs("g0", tmp_path / "g0")
    dirs.log.mkdir(parents=True)
    dirs.server_log.write_bytes(H100_FAULT.read_bytes())
    daemon = Daemon(dirs, tmp_path / "g0.lock", load_settings({}, env={}))
    assert len(daemon.status()["faults"]) == 1  # in time: the log is read
    late = daemon.status(_wait.Deadline(0))
    assert late["faults"] == [] and late["error"].startswith(NOT_IN_TIME), late
