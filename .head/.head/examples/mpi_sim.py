"""mpi4py + ``mpswrap.session()`` without a GPU: the shape of mpi_torch.py on the MPS simulator.

    mpirun -np 4 python3 examples/mpi_sim.py         (add --allow-run-as-root as root)

Set up the simulator first (docs/tutorial.md, step 1). Where mpi_torch.py makes its first CUDA
call, this example connects to the daemon the way CUDA does, through the simulator's client.
"""

from __future__ import annotations

import mpswrap
from mpswrap.sim.client import Client, parse


def main() -> None:
    with mpswrap.session() as s:  # before CUDA, and before MPI_Init
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        cuda = Client(parse([]))  # stands for CUDA: the first call attaches to MPS
        if cuda.attach() is None:
            raise SystemExit("no MPS daemon reached: CUDA would run without MPS")
        server = s.check_attached()  # raises if this process is not a client
        rows = comm.gather((comm.Get_rank(), s.local_rank, s.gpu_uuid[:12], s.mode, server))
        if cuda.sock is not None:
            cuda.sock.close()  # a real CUDA context lasts until the process exits
        if rows:
            for rank, local, gpu, mode, pid in rows:
                print(f"rank {rank}: local rank {local}, {gpu}..., {mode} daemon, server {pid}")


if __name__ == "__main__":
    main()
