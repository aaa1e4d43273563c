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
