"""Signals on busy MPS clients, the evidence for the shield (DESIGN.md, Signals), identical for
the simulator and the real driver.

Seen on an H100 (driver 580.159.04, 2026-11-27, PyTorch clients in 8192² matmul loops): busy
clients killed by signals made an untouched client fail with a CUDA error; 8 killed at once
left the server unable to serve the next client ("CUDA-capable device(s) is/are busy or
unavailable"), with a fatal GPU error and a device reset in server.log; in a later run on the
same driver the server served the next client after such a fault (the untouched client still
failed). The tests that kill busy clients outright assert the harm seen every time: one that
fails means the driver no longer shows it, and the shield could be reconsidered. The same
clients ended through ``terminate_client`` first and then killed harmed nobody where they
started first, in every run; left to exit on their own, 8 of them made a client fail with an
illegal memory access (700) in each of three runs on four H200s (2026-11-28: the untouched
client, started after them, or a victim itself), and nobody on the H100 and on two H200s.
terminate_client first is better than a signal, not harmless. Where an earlier busy client
runs on, terminate_client harms the server too: on an H100 (2026-11-28,
docs/gpu-results/2026-11-28-h100) the next client was refused with 46 after every ending
tried; on two H200s the same day the KILL ending left the next client running once, and on
four H200s (392a34a) the next client ran after every ending, the earlier client failing with
700 after KILL. These tests assert what held in every run; where a driver has shown either
outcome (victims exiting on their own; the next client after an earlier busy client's
neighbour was ended) they pass either, and print which. With 8 victims started together and
exiting on their own, a later ``terminate_client`` went unanswered on the H100 (the simulator
answers); they now start in order, and so they were answered on two and four H200s.

A real server may be left unable to serve: each test has a daemon of its own, the tests that
expect no harm come first, the one that leaves a server unable to serve last, and the gpu tier
runs them all after its other tests (marker ``harm``, phase ``signals`` of
tests/gpu/run_gpu_tier.sh).
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.waits import wait_until

from .conftest import Backend

pytestmark = [pytest.mark.contract, pytest.mark.harm]

#: The side of the busy clients' matrix products: the finding's 8192².
BUSY = "8192"
#: Busy clients the finding killed at once.
SEVERAL = 8
#: Seconds an untouched client is given to show the harm (or a stopped client to exit).
SHOWN = 60
SIGNALS = [pytest.param(signal.SIGTERM, id="TERM"), pytest.param(signal.SIGKILL, id="KILL")]
COUNTS = [pytest.param(1, id="one"), pytest.param(SEVERAL, id="several")]
#: How a terminated victim ends: on its own (its next call fails with 810), or by a signal.
ENDINGS = [pytest.param(None, id="exit"), *SIGNALS]
FATAL = "encountered a fatal GPU error"


def _busy(
    backend: Backend, count: int, *extra: str, group: int | None = None
) -> list[subprocess.Popen[str]]:
    """``count`` busy clients, each past its first product (its loop under way) before the
    next starts, so that they attach in that order; with ``group`` (0), all in one new process
    group."""
    clients: list[subprocess.Popen[str]] = []
    for _ in range(count):
        joins = group if group is None or not clients else clients[0].pid
        clients.append(backend.client("--seconds", "300", "--busy", BUSY, *extra, group=joins))
        backend.started(clients[-1])
    return clients


def _scene(
    backend: Backend, count: int, *victim_args: str, bystander_first: bool = False
) -> tuple[int, list[subprocess.Popen[str]], subprocess.Popen[str]]:
    """A fresh daemon, ``count`` busy victims and one busy client nobody touches (started
    after the victims, or with ``bystander_first`` before them)."""
    backend.start_daemon()
    early = _busy(backend, 1) if bystander_first else []
    victims = _busy(backend, count, *victim_args, group=0)
    bystander = early[0] if early else _busy(backend, 1)[0]
    server = backend.server()
    listed = backend.wait_clients(server, count + 1)
    assert sorted(listed) == sorted(p.pid for p in [*victims, bystander]), listed
    return server, victims, bystander


def _kill(victims: list[subprocess.Popen[str]], sig: signal.Signals) -> None:
    """``sig`` to every victim at once, to their process group (as mpirun signals a rank's),
    then each seen dying of it."""
    os.killpg(victims[0].pid, sig)
    for proc in victims:
        out, _ = proc.communicate(timeout=SHOWN)
        assert proc.returncode == -sig, (proc.returncode, out)


def _end(proc: subprocess.Popen[str]) -> str | None:
    """Its output once it has exited within ``SHOWN`` seconds; None if it still runs."""
    try:
        return proc.communicate(timeout=SHOWN)[0]
    except subprocess.TimeoutExpired:
        return None


def _next_client(backend: Backend) -> tuple[int, str]:
    after = backend.client("--seconds", "1")
    out, _ = after.communicate(timeout=SHOWN)
    return after.returncode, out


def _new_server(backend: Backend, server: int) -> None:
    """``shutdown_server -f`` of a server left unable to serve: the next client gets a new
    one."""
    backend.control().command(f"shutdown_server {server} -f")
    wait_until(lambda: server not in backend.control().server_list(), 30, "the server to go")


def _harm(seen: bool, what: str) -> None:
    assert seen, (
        f"{what}: this driver no longer shows the harm of ending busy MPS clients (seen on an "
        "H100, driver 580.159.04, 2026-11-27); the shield could be reconsidered "
        "(docs/howto-users.md, Signals)"
    )


def _bystander_after_terminate(
    backend: Backend, server: int, bystander: subprocess.Popen[str], harm_seen: bool
) -> None:
    """The untouched client after the victims were ended through terminate_client: it runs
    on, is still listed, its first CUDA error is the 810 of its own terminate_client, and the
    server is ACTIVE without a fatal error. ``harm_seen``: a driver has shown it failing
    instead (four H200s, 2026-11-28: victims exiting on their own, error 700), so that
    passes too, once the server recovers; which it did is printed."""
    ctl = backend.control()
    harmed = None if bystander.poll() is None else bystander.communicate()[0]
    if harmed is None:
        ctl.terminate_client(server, bystander.pid)  # its first CUDA error is this one
        ended = _end(bystander)
        assert ended is not None, "the untouched client outlived its terminate_client"
        if "CUDA error 810" not in ended:
            harmed = ended  # a failure of its own that surfaced only now
    if harmed is not None:
        print(f"the untouched client failed: {harmed!r}")
        assert harm_seen, f"the untouched client failed: {harmed!r}"
        assert bystander.returncode != 0 and "CUDA error" in harmed, harmed
        wait_until(backend.recovered, 30, "the server to recover once the failed client is gone")
        return
    print("the untouched client ran on")
    assert ctl.server_status(server) == "ACTIVE"
    assert FATAL not in backend.server_log(), backend.server_log()


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("sig", SIGNALS)
def test_busy_clients_ended_through_terminate_client_then_killed_harm_nobody(
    backend: Backend, sig: signal.Signals, count: int
) -> None:
    """What mpswrap's supervisor does: terminate_client for each busy client, then the signal
    at once, the victims having started first. The next client runs, the untouched client
    runs on (every run so far), the server stays ACTIVE."""
    # --linger: after its 810 a victim stays on the host, so the signal finds it alive.
    server, victims, bystander = _scene(backend, count, "--linger", str(SHOWN))
    ctl = backend.control()
    for proc in victims:
        ctl.terminate_client(server, proc.pid)
    _kill(victims, sig)
    code, out = _next_client(backend)
    assert code == 0, out
    _bystander_after_terminate(backend, server, bystander, harm_seen=False)


@pytest.mark.parametrize("count", COUNTS)
def test_busy_clients_ended_through_terminate_client_that_exit_on_their_own_harm_nobody(
    backend: Backend, count: int
) -> None:
    """What a terminated client does when nothing signals it: its next CUDA call fails and it
    exits at once, its work just ended by the server. The victims started first; the next
    client runs. The untouched client ran on and the server stayed ACTIVE on the H100 and two
    H200s; on four H200s it failed with 700 (8 victims at 392a34a; at 4e40ed8 a victim, too,
    got 700 instead of its 810, and under mpswrap one victim harmed the other rank's client
    three times in four): either fate passes, and which is printed."""
    server, victims, bystander = _scene(backend, count)
    ctl = backend.control()
    for proc in victims:
        ctl.terminate_client(server, proc.pid)
    errors = []
    for proc in victims:
        out = _end(proc)
        assert out is not None and proc.returncode != 0 and "CUDA error" in out, out
        errors.append("810" if "CUDA error 810" in out else out.strip()[-80:])
    print(f"the victims' errors: {errors}")
    code, out = _next_client(backend)
    assert code == 0, out
    _bystander_after_terminate(backend, server, bystander, harm_seen=True)


@pytest.mark.parametrize("sig", SIGNALS)
def test_a_busy_client_killed_by_a_signal_fails_an_untouched_one(
    backend: Backend, sig: signal.Signals
) -> None:
    """One busy client dies of the signal: the untouched client fails with a CUDA error; once
    it has gone the server recovers and the next client runs (seen after two such deaths)."""
    _, victims, bystander = _scene(backend, 1)
    _kill(victims, sig)
    out = _end(bystander)
    _harm(
        out is not None and bystander.returncode != 0 and "CUDA error" in out,
        f"the untouched client, after one busy client died of {sig.name}: {out!r}",
    )
    wait_until(backend.recovered, 30, "the server to recover once the failed clients are gone")
    code, out = _next_client(backend)
    assert code == 0, out


@pytest.mark.parametrize("sig", ENDINGS)
def test_a_busy_client_ended_through_terminate_client_while_an_earlier_one_runs_harms_the_server(
    backend: Backend, sig: signal.Signals | None
) -> None:
    """The untouched busy client starts first (it starts the server), then the victim; the victim
    is ended through terminate_client, then exits on its own or is killed. Seen on an H100
    (driver 580.159.04, 2026-11-28, every run): the next client is refused with 46, "busy or
    unavailable"; with ranks under mpswrap (per-rank mode) the earlier client failed with 700.
    On two H200s (same driver, 2026-11-28, docs/gpu-results/2026-11-28-h200x2-7713636) the exit
    and TERM endings did the same, and after KILL the next client ran; on four H200s
    (docs/gpu-results/2026-11-28-h200x4-392a34a) the next client ran after every ending, and
    after KILL the earlier client failed with 700. The harm is possible after every ending, and
    which form it takes is not certain after any: the next client refused with 46 or run both
    pass (any other outcome fails), and which is printed, as is what happens to the untouched
    client."""
    extra = [] if sig is None else ["--linger", str(SHOWN)]
    server, victims, bystander = _scene(backend, 1, *extra, bystander_first=True)
    ctl = backend.control()
    ctl.terminate_client(server, victims[0].pid)
    if sig is None:
        out = _end(victims[0])
        assert out is not None and "CUDA error 810" in out, out
    else:
        _kill(victims, sig)
    code, out = _next_client(backend)
    refused = code != 0 and "CUDA error 46" in out
    assert refused or code == 0, f"the next client: {out!r}"
    print(f"the next client: {'refused with 46' if refused else 'ran'}")
    print(f"the untouched client: {_end(bystander)!r}")
    if bystander.poll() is None:
        bystander.kill()
        bystander.communicate()
    _new_server(backend, server)


@pytest.mark.parametrize("sig", SIGNALS)
def test_busy_clients_killed_at_once_fail_an_untouched_one_with_a_fatal_gpu_error(
    backend: Backend, sig: signal.Signals
) -> None:
    """8 busy clients die of the signal at once: the untouched one fails and server.log has a
    fatal GPU error. The next client may fail too: the server, still listed, failed it in the
    first finding, and ran it on the same driver in a later run (2026-11-27), so either is
    allowed, and said. ``shutdown_server -f`` then gives the next client a new server."""
    server, victims, bystander = _scene(backend, SEVERAL)
    _kill(victims, sig)
    out = _end(bystander)
    _harm(
        out is not None and bystander.returncode != 0 and "CUDA error" in out,
        f"the untouched client, after {SEVERAL} busy clients died of {sig.name}: {out!r}",
    )
    _harm(FATAL in backend.server_log(), f"no fatal GPU error in server.log after {sig.name}")
    code, out = _next_client(backend)
    failed = code != 0 and "CUDA error" in out
    print(f"the next client {'failed' if failed else 'ran'} after {sig.name}: {out!r}")
    assert failed or code == 0, out
    assert server in backend.control().server_list()
    _new_server(backend, server)
    code, out = _next_client(backend)
    assert code == 0, f"after shutdown_server -f: {out!r}"
