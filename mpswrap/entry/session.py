"""``with mpswrap.session() as s:``: MPS for an mpi4py program, set up from inside it.

Each rank gets its GPU's ``CUDA_MPS_PIPE_DIRECTORY``/``CUDA_MPS_LOG_DIRECTORY`` and
``CUDA_VISIBLE_DEVICES=<UUID>`` in ``os.environ`` before CUDA starts, finding the prolog's
daemons or starting user-mode ones.

Design (the simplest that cannot hang or kill its own ranks):

- Before MPI: when ``mpi4py.MPI`` is not initialised and the launcher's variables give the
  local rank, every rank attaches by itself (``owner.attach`` is idempotent under the job's
  file lock) and mpi4py is never imported. A CUDA-aware MPI may initialise CUDA inside
  ``MPI_Init``, so this is the path to prefer: enter the session before ``from mpi4py import MPI``.
- After MPI: the node-local communicator gives the local rank; local rank 0 attaches first
  (starts the daemons), then sends its outcome to the others, who wait for it bounded and
  re-raise the leader's error, or attach in turn (cheap: the daemons are running).
- Every rank holds its own owner reference, so exit is local, with no collective: the last
  reference stops user-mode daemons, never a prolog's. A rank that is still an MPS client
  (its CUDA context lives until the process exits) keeps its reference instead: stopping the
  daemons now would terminate_client and SIGKILL that very rank. Its reference goes stale
  when it exits and the owner watchdog then stops the daemons (also after ``MPI_Abort``).
- An exception escaping the session: local cleanup, then ``MPI_Abort`` (``abort_on_error``),
  so the ranks blocked in a collective end instead of hanging the job.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from types import TracebackType
from typing import Any

from .. import _wait
from ..config import load_settings
from ..errors import DaemonError, MpswrapError
from ..job.attached import Session
from ..job.run import LaunchOptions, Plan, Result, Run, plan
from ..jobenv import JobEnv
from ..mps.cuda import cuda_error, cuda_started
from ..mps.gpu import load_inventory

__all__ = ["Session", "session"]

log = logging.getLogger(__name__)

LEADER_TAG = 7077  # on a private node communicator: cannot meet the user's messages
DEFAULT_TIMEOUT = 300.0
PIPE_VAR = "CUDA_MPS_PIPE_DIRECTORY"
_ACTIVE: list[session] = []  # at most one session per process


class session:  # a class used like a function: `with mpswrap.session() as s:`
    """Attach this rank to its GPU's MPS daemon for the ``with`` block (see module doc).

    ``gpus``: ``auto`` (the step's GPUs) or NVML indices/UUIDs; ``threads``: none, uniform,
    oversubscribe, a percent or ``w1:w2``; ``mem_limit``: e.g. ``2G``; ``policy``: block,
    cyclic or affinity; ``timeout``: seconds to wait for the node leader; ``abort_on_error``:
    ``MPI_Abort`` when an exception escapes, so that no rank hangs.
    """

    def __init__(
        self,
        comm: Any = None,
        *,
        gpus: str = "auto",
        threads: str | float | None = None,
        mem_limit: str | None = None,
        verify: bool = True,
        policy: str | None = None,
        timeout: float | None = None,
        abort_on_error: bool = True,
    ) -> None:
        self.comm = comm
        self.gpus = gpus
        self.threads = None if threads is None else str(threads)
        self.mem_limit = mem_limit
        self.verify = verify
        self.policy = policy
        self.timeout = timeout
        self.abort_on_error = abort_on_error
        self._run: Run | None = None
        self._session: Session | None = None
        self._saved: dict[str, str | None] = {}

    # --- enter --------------------------------------------------------------------------
    def __enter__(self) -> Session:
        if _ACTIVE:
            raise MpswrapError(
                "a session is already active",
                thing=f"pid {os.getpid()}",
                cause="session() entered twice (nested, or a second one in the process)",
                hint="use one `with mpswrap.session()` around the whole program",
                context="session",
            )
        _ACTIVE.append(self)
        try:
            self._session = self._enter()
        except BaseException as exc:
            if isinstance(exc, MpswrapError):
                exc.with_context("session")
            self._cleanup()
            self._maybe_abort(exc, exc.__traceback__)
            raise
        return self._session

    def _enter(self) -> Session:
        opts = LaunchOptions(
            gpus=None if self.gpus == "auto" else self.gpus,
            policy=self.policy,
            threads=self.threads,
            mem_limit=self.mem_limit,
        )
        settings = load_settings({"pinned_mem_limit": self.mem_limit, "gpu_policy": self.policy})
        planned = plan(opts, "session", rank=True, step=True, settings=settings)
        inventory = load_inventory(planned.settings.gpu_inventory)
        started = cuda_started(inventory)
        if started and not os.environ.get(PIPE_VAR):
            raise cuda_error(started)
        comm = self._initialised_comm()
        if comm is not None:
            run, local = self._attach_leader_first(comm, planned)
        else:  # before MPI, every rank by itself; no launcher and no MPI: a single process
            local = _launcher_local(planned.env) or (0, 1)
            run = self._attach(planned.use(local[1]))  # every local rank of ours
        if local[0] == 0:
            run.attachment.announce()
        sess = self._place(run, local)
        if started and os.environ.get(PIPE_VAR) != sess.env[PIPE_VAR]:
            raise cuda_error(started)
        self._set_environ(sess.env)
        if self.verify:
            _verify(sess)
        log.info(
            "session: local rank %d/%d on %s (%s daemons), pipe %s",
            sess.local_rank,
            sess.local_size,
            sess.gpu_uuid,
            sess.mode,
            sess.pipe_dir,
        )
        return sess

    def _initialised_comm(self) -> Any:
        """The communicator to use, or None before MPI (never forces ``MPI_Init``)."""
        if self.comm is not None:
            return self.comm
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            return mpi.COMM_WORLD
        if mpi is None and _launcher_local(JobEnv.current()) is None and _mpi4py_autoinit():
            # No launcher variables: only MPI knows the local rank. Importing mpi4py.MPI
            # runs MPI_Init here (a CUDA-aware MPI may start CUDA before our variables).
            from mpi4py import MPI

            return MPI.COMM_WORLD
        return None

    def _attach(self, planned: Plan) -> Run:
        """The one context manager every run enters, here for the ``with`` block of the
        user's program: its signals are its own, and nothing is recorded."""
        self._run = Run(planned, signals=False, announce=False).__enter__()
        return self._run

    def _attach_leader_first(self, comm: Any, planned: Plan) -> tuple[Run, tuple[int, int]]:
        from mpi4py import MPI

        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        rank, size = node.Get_rank(), node.Get_size()
        if rank == 0:
            try:
                run = self._attach(planned.use(size))  # every local rank of ours
            except Exception as exc:
                _tell(node, size, _as_leader_error(exc))
                raise
            _tell(node, size, None)
        else:
            failed = self._wait_leader(node)
            if failed is not None:
                raise failed  # every rank fails the same way, none waits forever
            run = self._attach(planned.use(size))
        node.Free()
        return run, (rank, size)

    def _wait_leader(self, node: Any) -> MpswrapError | None:
        limit = self.timeout or DEFAULT_TIMEOUT
        for _ in _wait.backoff(limit, first=0.001, cap=0.05):
            if node.iprobe(source=0, tag=LEADER_TAG):
                outcome: MpswrapError | None = node.recv(source=0, tag=LEADER_TAG)
                return outcome
        raise MpswrapError(
            "node leader did not attach in time",
            thing="local rank 0",
            cause=f"no word after {limit:g} s",
            context="session",
            hint="is local rank 0 stuck or dead? raise timeout= if the daemons start slowly",
        )

    def _place(self, run: Run, local: tuple[int, int]) -> Session:
        rank, size = local
        planned, att = run.plan, run.attachment
        found = planned.place(rank, size)
        manifest = next(m for m in att.manifests if m.gpu_uuid == found.uuid)
        shown = manifest.settings.get("active_thread_percentage")
        return Session(
            gpu_uuid=found.uuid,
            local_rank=rank,
            local_size=size,
            pipe_dir=found.slot.dirs.pipe,
            log_dir=found.slot.dirs.log,
            active_thread_percentage=shown if found.threads is None else found.threads,
            mode=att.mode,
            env=found.env,
            settings=planned.settings,
        )

    def _set_environ(self, variables: dict[str, str]) -> None:
        # The one place mpswrap changes os.environ: CUDA reads these when it initialises in
        # this very process (possibly inside MPI_Init, for a CUDA-aware MPI), so they cannot
        # be passed any other way. The old values come back at exit.
        for name, value in variables.items():
            self._saved.setdefault(name, os.environ.get(name))
            os.environ[name] = value

    # --- exit ---------------------------------------------------------------------------
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._cleanup()
        if exc is not None:
            self._maybe_abort(exc, tb)

    def _cleanup(self) -> None:
        """Local only (no collective): restore the environment, drop our reference. Never
        raises: a failed stop is logged, and the watchdog or the epilog sweeps it up."""
        run, sess, self._run, self._session = self._run, self._session, None, None
        try:
            for name, value in self._saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            self._saved.clear()
            if run is not None:
                _leave(run, sess)
        finally:
            _ACTIVE.clear()

    def _maybe_abort(self, exc: BaseException, tb: TracebackType | None) -> None:
        status = _exit_status(exc)
        comm = _abort_comm(self.comm) if self.abort_on_error and status else None
        if comm is None:
            return
        # MPI_Abort ends the process at once: show the error first, as Python would have.
        if isinstance(exc, MpswrapError):
            print(exc.render(), file=sys.stderr)
        else:
            traceback.print_exception(type(exc), exc, tb)
        print(
            f"mpswrap: session: {type(exc).__name__} escaped the session; calling "
            f"MPI_Abort({status}) so the other ranks do not hang",
            file=sys.stderr,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        comm.Abort(status)


# --- helpers -------------------------------------------------------------------------------
def _launcher_local(env: JobEnv) -> tuple[int, int] | None:
    rank, size = env.local_rank, env.local_size
    return (rank, size) if rank is not None and size is not None else None


def _mpi4py_autoinit() -> bool:
    try:
        import mpi4py
    except ImportError:
        return False
    return bool(mpi4py.rc.initialize)


def _verify(sess: Session) -> None:
    """The daemon answers through the pipe directory this rank got, as this user."""
    if not sess._control().ping():
        raise DaemonError(
            "MPS daemon does not answer",
            thing=str(sess.pipe_dir),
            cause="get_server_list failed from this rank",
            context="session",
            hint="check `mpswrap status` and that this user can reach the "
            "pipe directory (else CUDA runs without MPS, silently)",
        )


def _leave(run: Run, sess: Session | None) -> None:
    if sess is not None and sess.is_client():
        # Our CUDA context lives until this process exits: stopping the daemons now would
        # terminate and kill this rank. The watchdog stops them once our reference is stale.
        log.debug("session: still an MPS client; daemons stop after this process exits")
        run.keep()
    run.result = Result(0)
    try:
        run.__exit__(None, None, None)
    except MpswrapError as exc:
        log.warning("session: %s", exc.line())


def _tell(node: Any, size: int, outcome: MpswrapError | None) -> None:
    """The node leader's outcome to every other local rank (small: sent eagerly)."""
    from mpi4py import MPI

    MPI.Request.waitall([node.isend(outcome, dest=r, tag=LEADER_TAG) for r in range(1, size)])


def _as_leader_error(exc: Exception) -> MpswrapError:
    if isinstance(exc, MpswrapError):
        return exc.with_context("session: node leader")
    return MpswrapError("failed", cause=repr(exc), context="session: node leader")


def _exit_status(exc: BaseException) -> int:
    """Like ``python -m mpi4py``: SystemExit's code, 130 for Ctrl-C, else 1."""
    if isinstance(exc, SystemExit):
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def _abort_comm(comm: Any) -> Any:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return None
    if mpi.COMM_WORLD.Get_size() == 1:
        return None  # nobody to wait for: let Python print and exit as usual
    return comm if comm is not None else mpi.COMM_WORLD
