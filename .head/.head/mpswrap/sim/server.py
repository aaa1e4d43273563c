"""The simulated ``nvidia-cuda-mps-server``: a process that exists for as long as a server would.

The daemon keeps the server's state; this process only gives it a real PID (listed by
``get_server_list``, inheriting the daemon's environment, uid and CPU affinity, killable by
PID). Like the real server it takes no arguments. It prints ``ready`` once started and exits
when the daemon writes ``exit`` on its stdin.

If the daemon dies without telling it (a crash), it stays behind as an orphan, as a real
server would: cleaning it up is the job of whoever owns the daemon. Only when a test asks for
the simulator's safety net (``self_clean``) does it exit once the pipe directory of its
environment is deleted, or after ORPHAN_LIMIT seconds orphaned.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

from . import _faults
from ._common import FAULTS_VAR, pipe_dir

ORPHAN_LIMIT = 600.0
POLL = 1.0


def _pipe_gone(pipe: str) -> bool:
    try:
        os.stat(pipe)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


def _self_clean() -> bool:
    return _faults.load(os.environ.get(FAULTS_VAR)).self_clean


def serve(pipe: str) -> int:
    print("ready", flush=True)
    orphaned_at: float | None = None
    while not (_pipe_gone(pipe) and _self_clean()):
        if orphaned_at is None:
            readable, _, _ = select.select([0], [], [], POLL)
            data = os.read(0, 4096) if readable else b""
            if b"exit" in data:
                return 0
            if readable and not data:
                orphaned_at = time.monotonic()  # stdin closed: the daemon died
        else:
            if time.monotonic() - orphaned_at > ORPHAN_LIMIT and _self_clean():
                return 0
            time.sleep(POLL)
    return 0


def main(argv: list[str] | None = None) -> int:
    if sys.argv[1:] if argv is None else argv:
        print("nvidia-cuda-mps-server: takes no arguments", file=sys.stderr)
        return 2
    # An ordinary program: SIGINT ends it like SIGTERM, no KeyboardInterrupt traceback.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    return serve(str(pipe_dir()))


if __name__ == "__main__":
    sys.exit(main())
