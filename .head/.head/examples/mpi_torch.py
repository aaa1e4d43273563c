"""mpi4py + PyTorch under MPS: every rank trains a small MLP, ranks share GPUs through MPS.

    mpirun -np 8 python examples/mpi_torch.py        (add --allow-run-as-root as root)

Rules: enter ``mpswrap.session()`` before anything uses CUDA, and preferably before
``from mpi4py import MPI`` (a CUDA-aware MPI may initialise CUDA inside MPI_Init).
Importing torch first is fine; creating a CUDA tensor first is not.
"""

from __future__ import annotations

import time

import torch

import mpswrap


def train(steps: int = 1500) -> float:
    """784-512-512-10 MLP, batch 64, SGD, a host sync per step (benchmarks/workers/mlp.py)."""
    dev = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(64, 784, device=dev)
    y = torch.randint(0, 10, (64,), device=dev)
    loss = torch.zeros((), device=dev)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()  # host sync, like a real training loop logging its loss
    return float(loss.item())


def main() -> None:
    with mpswrap.session() as s:
        from mpi4py import MPI  # after the session: MPI_Init may touch CUDA

        comm = MPI.COMM_WORLD
        rank = comm.Get_rank()
        torch.manual_seed(rank)
        torch.zeros(1, device="cuda")  # first CUDA call: this process becomes an MPS client
        server = s.check_attached()  # raises if CUDA ran without MPS (silently, otherwise)
        start = time.perf_counter()
        loss = train()
        seconds = time.perf_counter() - start
        print(
            f"rank {rank}/{comm.Get_size()} local {s.local_rank}/{s.local_size} "
            f"gpu {s.gpu_uuid} ({torch.cuda.get_device_name()}) {s.mode} daemon, "
            f"attached to MPS server {server}: loss {loss:.3f} in {seconds:.2f} s",
            flush=True,
        )
        times = comm.gather(seconds, root=0)
        if rank == 0 and times:
            print(f"{len(times)} ranks, slowest {max(times):.2f} s", flush=True)


if __name__ == "__main__":
    main()
