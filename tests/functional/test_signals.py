"""What a program sees of mpswrap's signal shield, on the MPS simulator (docs/howto-users.md,
Signals): once its clients are ended through terminate_client, each process of the rank gets
the signal as it would without the shield, at once rather than after the grace period; a
process that never touches CUDA can take the shield off itself (``mpswrap.unshield``).

SIGTERM goes to the supervisor alone, as ``kill <mpswrap pid>`` sends it: the program hears of
it only from mpswrap.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.simenv import SimNode
from tests.waits import wait_until

pytestmark = pytest.mark.functional

#: The runs' grace period: what the ladder would wait before SIGKILL, were nothing delivered.
GRACE = 60


def _ends(rec: Path) -> list[str]:
    """How the simulated clients that record to ``rec`` ended, in order."""
    lines = rec.read_text().splitlines() if rec.exists() else []
    return [r["reason"] for r in map(json.loads, lines) if r["event"] == "end"]


def _started(rec: Path) -> bool:
    return rec.exists() and '"start"' in rec.read_text()


def _term(proc: subprocess.Popen[str]) -> tuple[float, str]:
    """SIGTERM to the supervisor alone; seconds until it exited, and its stderr."""
    start = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=GRACE + 30)
    return time.monotonic() - start, err


def test_a_rank_with_a_child_that_is_no_client_ends_at_once_with_143(node: SimNode) -> None:
    """The rank (a shell, no client) waits for a busy client and for a child that is no
    client; all of them inherited the shield. The client is terminated (no fault), the shell
    and its other child get SIGTERM's default action: the run ends well before the grace."""
    rec = node.root / "rec.json"
    client = f"{node.client} --seconds 300 --busy 64 --record {rec}"
    script = f"sleep 300 & {client}; wait"
    proc = node.start("run", "-n", "1", "--grace", str(GRACE), "--", "sh", "-c", script)
    wait_until(lambda: _started(rec), 30, "the client to start")
    took, err = _term(proc)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert took < GRACE / 2, f"{took:.1f} s: the grace period ran out ({err})"
    assert _ends(rec) == ["terminated"], err
    assert "exit codes 143," in err, err


def test_a_program_with_its_own_sigterm_handler_gets_it_after_terminate_client(
    node: SimNode, tmp_path: Path
) -> None:
    rec, said = node.root / "rec.json", tmp_path / "said"
    program = tmp_path / "handler.py"
    program.write_text(
        "import json, signal, subprocess, sys, time\n"
        "def handler(sig, frame):\n"
        f"    ends = [json.loads(r)['reason'] for r in open({str(rec)!r}) if '\"end\"' in r]\n"
        f"    open({str(said)!r}, 'w').write(signal.Signals(sig).name + ' ' + ','.join(ends))\n"
        "    sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, handler)\n"
        f"subprocess.run([{node.client!r}, '--seconds', '300', '--busy', '64', '--record', "
        f"{str(rec)!r}])\n"
        "while True:\n"
        "    time.sleep(1)\n"
    )
    proc = node.start("run", "-n", "1", "--grace", str(GRACE), "--", sys.executable, str(program))
    wait_until(lambda: _started(rec), 30, "the client to start")
    took, err = _term(proc)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert said.read_text() == "SIGTERM terminated", err  # its client had been ended
    assert "exit codes 3," in err, err
    assert took < GRACE / 2, f"{took:.1f} s: the grace period ran out ({err})"


@pytest.mark.parametrize(("args", "shield"), [([], "TERM,INT,HUP"), (["--no-shield"], "")])
def test_multiprocessing_terminate_ends_a_worker_that_called_unshield(
    node: SimNode, tmp_path: Path, args: list[str], shield: str
) -> None:
    program = tmp_path / "workers.py"
    program.write_text(
        "import multiprocessing, os, time\n"
        "import mpswrap\n"
        "def work(ready):\n"
        "    mpswrap.unshield()\n"
        "    ready.set()\n"
        "    time.sleep(300)\n"
        "if __name__ == '__main__':\n"
        "    print('MPSWRAP_SHIELD=' + os.environ['MPSWRAP_SHIELD'])\n"
        "    ready = multiprocessing.Event()\n"
        "    worker = multiprocessing.Process(target=work, args=(ready,))\n"
        "    worker.start()\n"
        "    assert ready.wait(60)\n"
        "    worker.terminate()\n"
        "    worker.join(60)\n"
        "    print('worker exit code', worker.exitcode)\n"
    )
    res = node.run("run", "-n", "1", *args, "--", sys.executable, str(program), timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"[0] MPSWRAP_SHIELD={shield}\n" in res.stdout, res.stdout
    assert f"[0] worker exit code {-signal.SIGTERM}\n" in res.stdout, res.stdout
