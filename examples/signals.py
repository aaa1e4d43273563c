"""What a program sees of mpswrap's signal shield, and how it ends workers of its own.

    mpswrap run -n 1 -- python3 examples/signals.py

No GPU needed (it touches no CUDA; on the MPS simulator too). It prints the signal
dispositions it started with, ends a multiprocessing worker that took the shield off itself
(``mpswrap.unshield()``), installs a SIGTERM handler of its own and asks mpswrap to stop it,
as ``scancel`` would: mpswrap ends the rank's MPS clients through ``terminate_client``, then
delivers SIGTERM, which the handler gets. mpswrap then exits 143 (128 + SIGTERM).
docs/howto-users.md, Signals, says why.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from types import FrameType

import mpswrap

SHOWN = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1")


def disposition(sig: signal.Signals) -> str:
    handler = signal.getsignal(sig)
    if handler is signal.SIG_IGN:
        return "ignored"
    if handler in (signal.SIG_DFL, signal.default_int_handler):
        return "default"
    return "handled"


def work(ready: multiprocessing.synchronize.Event) -> None:
    """A worker that never touches CUDA can harm no MPS server: it takes the shield off."""
    mpswrap.unshield()
    ready.set()
    time.sleep(600)


def stopped(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    print(f"got {name} from mpswrap, after it ended this rank's MPS clients: exiting", flush=True)
    sys.exit(0)


def main() -> int:
    if "MPSWRAP_SHIELD" not in os.environ:
        print("run me under mpswrap: mpswrap run -n 1 -- python3 examples/signals.py")
        return 2
    print(f"MPSWRAP_SHIELD={os.environ['MPSWRAP_SHIELD']}")
    print(", ".join(f"{name} {disposition(signal.Signals[name])}" for name in SHOWN))
    ready = multiprocessing.Event()
    worker = multiprocessing.Process(target=work, args=(ready,))
    worker.start()
    ready.wait(60)
    worker.terminate()  # SIGTERM: ignored by a worker that kept the shield
    worker.join(60)
    print(f"a worker that called mpswrap.unshield(): terminate() ended it ({worker.exitcode})")
    signal.signal(signal.SIGTERM, stopped)
    print("own SIGTERM handler installed; asking mpswrap to stop this rank", flush=True)
    os.kill(os.getppid(), signal.SIGTERM)  # our parent: mpswrap's supervisor of this rank
    time.sleep(60)
    return 1  # not reached: the handler exits


if __name__ == "__main__":
    sys.exit(main())
