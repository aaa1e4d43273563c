"""nbody-style compute worker: all-pairs gravitational accelerations on the GPU (PyTorch).

The start-up, handshake and JSON line of protocol.py, as every throughput worker."""

import sys
from collections.abc import Callable

import protocol  # beside this file

if not protocol.standing_in():  # imported before the clock starts, as a program's own start
    import torch


def build(bodies: int) -> Callable[[int], None]:
    """``bodies`` random bodies at rest on the GPU; what runs a number of simulation steps."""
    pos = torch.randn(bodies, 3, device="cuda")
    vel = torch.zeros_like(pos)

    def steps(n: int) -> None:
        nonlocal pos, vel
        for _ in range(n):
            d = pos[None, :, :] - pos[:, None, :]
            inv = (d.square().sum(-1) + 1e-3).rsqrt() ** 3
            vel = vel + 1e-4 * (d * inv[..., None]).sum(1)
            pos = pos + 1e-3 * vel
            torch.cuda.synchronize()

    return steps


def main() -> int:
    p = protocol.parser(200)
    p.add_argument("--bodies", type=int, default=4096)
    args = p.parse_args()
    return protocol.serve(args, lambda: build(args.bodies), warmup=5)


if __name__ == "__main__":
    sys.exit(main())
