"""What the region runtime costs a step, A/B in one process: regional steady state of a
default-config Llama (the bench's model) with each block's ``forward`` its ``RegionRuntime``
(A, what torchkiln installs) against the same model with the group's compiled code bound
directly as each block's ``forward`` (B, what torchkiln before the runtime left after a first
call: no torchkiln frame of its own in front of the code). Rounds alternate, so drift and
the other core's load hit both alike; the ratio of medians is what to quote.

    python examples/region_runtime_overhead.py [--depth 16] [--backend inductor] [--rounds 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import types

import torch

import torchkiln
from torchkiln.examples import example_inputs, llama


def compiled(depth: int, backend: str) -> torch.nn.Module:
    model = llama(depth=depth)
    torchkiln.compile(model, backend=backend, progress="off")
    return model


def bind_code_directly(model: torch.nn.Module) -> None:
    """B: each block's forward is its group's code bound to it (no runtime frame)."""
    for layer in model.model.layers:
        runtime = layer.__dict__["forward"]
        assert runtime.run is not None, "call the model once first"
        layer.__dict__["forward"] = types.MethodType(runtime.run, layer)


def step_seconds(model: torch.nn.Module, inputs: torch.Tensor, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        model(inputs)
    return (time.perf_counter() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=5, help="calls per round and form")
    parser.add_argument("--json", help="write the numbers here")
    args = parser.parse_args()
    torch.manual_seed(0)
    runtime, direct = compiled(args.depth, args.backend), compiled(args.depth, args.backend)
    inputs = example_inputs(runtime, batch=1, seq=64)
    times: dict[str, list[float]] = {"runtime": [], "direct": []}
    with torch.no_grad():
        torch.testing.assert_close(runtime(inputs).logits, direct(inputs).logits)
        bind_code_directly(direct)
        for model in (runtime, direct):  # warm
            step_seconds(model, inputs, args.calls)
        for round_ in range(args.rounds):
            order = ("runtime", "direct") if round_ % 2 == 0 else ("direct", "runtime")
            for name in order:
                model = runtime if name == "runtime" else direct
                times[name].append(step_seconds(model, inputs, args.calls))
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["runtime"] / medians["direct"]
    print(f"depth {args.depth}, backend {args.backend}, {args.rounds} alternating rounds")
    print(f"  runtime (A): {medians['runtime'] * 1e3:.3f} ms a step (median)")
    print(f"  direct  (B): {medians['direct'] * 1e3:.3f} ms a step (median)")
    print(f"  A / B: {ratio:.4f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": vars(args), "median_seconds": medians, "ratio": ratio}, out)


if __name__ == "__main__":
    main()
