"""Small-MLP training worker (784-512-512-10, batch 64, SGD, a host sync every step).

Initialises CUDA and warms up, writes a ready file, waits for the go file, runs --steps and
prints one JSON line with its timings (protocol.py). Start-up is measured apart from the work.
"""

import sys
from collections.abc import Callable

import protocol  # beside this file

if not protocol.standing_in():  # imported before the clock starts, as a program's own start
    import torch


def build(weight: int) -> Callable[[int], None]:
    """The MLP, ``weight`` times as wide and its batch ``weight`` times as large, on the GPU;
    what runs a number of its training steps."""
    width = 512 * weight
    model = torch.nn.Sequential(
        torch.nn.Linear(784, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64 * weight, 784, device="cuda")
    y = torch.randint(0, 10, (64 * weight,), device="cuda")

    def steps(n: int) -> None:
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            torch.cuda.synchronize()

    return steps


def main() -> int:
    args = protocol.parser(4000, weighted=True).parse_args()
    weight = protocol.weight(args.weights)
    return protocol.serve(args, lambda: build(weight), warmup=20, weight=weight)


if __name__ == "__main__":
    sys.exit(main())
