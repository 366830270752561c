"""How much torchkiln's first-call bookkeeping adds, per region count.

Builds N tiny blocks (one ``nn.Linear(4, 4)`` each, one group), compiles them with Dynamo's
``eager`` backend, and times: planning + compiling in place (``torchkiln.compile``), the first
call (every region goes through its first-call shim), and a second call (bare compiled code).
The first call minus the second is what the first-call bookkeeping and the one trace cost; the
trace is the same for any N (one graph per group), so growth with N is the bookkeeping.

    python examples/first_call_overhead.py 1000 8000
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn

import torchkiln


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class Chain(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Tiny() for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def measure(depth: int) -> dict[str, float]:
    torch._dynamo.reset()
    model = Chain(depth)
    x = torch.randn(1, 4)
    with torch.no_grad():
        started = time.perf_counter()
        model(x)
        eager = time.perf_counter() - started
        started = time.perf_counter()
        torchkiln.compile(model, backend="eager", progress="off")
        compile_s = time.perf_counter() - started
        started = time.perf_counter()
        model(x)
        first = time.perf_counter() - started
        started = time.perf_counter()
        model(x)
        second = time.perf_counter() - started
    torchkiln.decompile(model)
    return {"eager": eager, "compile": compile_s, "first": first, "second": second}


def main(depths: list[int]) -> None:
    print("blocks  eager call s  torchkiln.compile s  first call s  second call s  first-second s")
    for depth in depths:
        m = measure(depth)
        print(
            f"{depth:6d}  {m['eager']:12.3f}  {m['compile']:19.3f}  {m['first']:12.3f}  "
            f"{m['second']:13.3f}  {m['first'] - m['second']:14.3f}"
        )


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1000, 8000])
