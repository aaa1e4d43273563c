"""mpi4py + CuPy under MPS: every rank integrates its own small n-body system on the GPU.

    mpirun -np 8 python examples/mpi_cupy.py         (add --allow-run-as-root as root)

Enter ``mpswrap.session()`` before CuPy touches the GPU and before ``from mpi4py import MPI``.
"""

from __future__ import annotations

import time

import cupy as cp

import mpswrap

# All-pairs gravity: one thread per body, O(n^2) work in small kernels (the kind MPS overlaps).
ACCEL_SOURCE = r"""
extern "C" __global__ void accel(const float3* p, float3* a, int n, float eps2) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float3 pi = p[i], ai = make_float3(0.f, 0.f, 0.f);
    for (int j = 0; j < n; ++j) {
        float dx = p[j].x - pi.x, dy = p[j].y - pi.y, dz = p[j].z - pi.z;
        float inv = rsqrtf(dx * dx + dy * dy + dz * dz + eps2);
        float s = inv * inv * inv;
        ai.x += dx * s; ai.y += dy * s; ai.z += dz * s;
    }
    a[i] = ai;
}
"""


def simulate(seed: int, n: int = 2048, steps: int = 200, dt: float = 1e-3) -> float:
    """Leapfrog-ish integration; returns the final kinetic energy (unit masses)."""
    accel = cp.RawKernel(ACCEL_SOURCE, "accel")  # built inside the session, like all CUDA use
    rng = cp.random.default_rng(seed)
    pos = rng.standard_normal((n, 3), dtype=cp.float32)  # (n, 3) float32 == float3[n]
    vel = cp.zeros_like(pos)
    acc = cp.empty_like(pos)
    threads = 128
    blocks = (n + threads - 1) // threads
    for _ in range(steps):
        accel((blocks,), (threads,), (pos, acc, cp.int32(n), cp.float32(1e-2)))
        vel += dt * acc
        pos += dt * vel
    return float(0.5 * (vel * vel).sum())


def main() -> None:
    with mpswrap.session() as s:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank = comm.Get_rank()
        cp.zeros(1)  # first CUDA call: this process becomes an MPS client
        server = s.check_attached()
        start = time.perf_counter()
        energy = simulate(seed=rank)
        cp.cuda.get_current_stream().synchronize()
        seconds = time.perf_counter() - start
        print(
            f"rank {rank}/{comm.Get_size()} local {s.local_rank}/{s.local_size} "
            f"gpu {s.gpu_uuid} {s.mode} daemon, MPS server {server}: "
            f"kinetic energy {energy:.4g} in {seconds:.2f} s",
            flush=True,
        )
        total = comm.allreduce(energy, op=MPI.SUM)
        if rank == 0:
            print(f"{comm.Get_size()} ranks, total kinetic energy {total:.4g}", flush=True)


if __name__ == "__main__":
    main()
