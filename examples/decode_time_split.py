"""Where a regionally compiled model's decode time goes, on this machine.

Runs greedy ``generate()`` on the built-in Llama example (default config, KV cache on),
compiled regionally with inductor, and splits each call's wall time into:

* **graphs**: inside the blocks' compiled inductor graphs (``CompiledFxGraph.__call__``), the
  work a full ``torch.compile`` also does;
* **block call, rest**: everything else between a block's ``forward`` being called and it
  returning: Dynamo's guard checks, the adapter, the compiled bytecode and AOTAutograd's
  runtime wrapper (the guards were timed apart while torchkiln had its own dispatcher);
* **outside the blocks**: the model's own eager code around them (embedding, rotary
  embedding, mask, final norm, ``lm_head``) and ``generate()``'s loop.

With ``--compare-full`` it also times the same ``generate()`` under a full ``torch.compile``
in alternating rounds, so the per-token ratio and the split come from one process::

    python examples/decode_time_split.py --depth 32 --new-tokens 16 --rounds 5 --compare-full
    python examples/decode_time_split.py --depth 2 --new-tokens 4 --rounds 1 --json split.json

The instrumentation wraps Python callables (a ``time.perf_counter`` pair around each), a few
hundred nanoseconds per block call; it patches inductor's ``CompiledFxGraph.__call__`` for the
rest of this script's process, so run it on its own. See docs/generation.md, "Where decode time goes".
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import torchkiln
from torchkiln.bench.generate import generate_once
from torchkiln.engine.compile_state import state_of
from torchkiln.examples import example_inputs, llama

PARTS = ("graphs", "block call, rest", "outside the blocks")


class Clock:
    """Seconds and calls, per part, since the last :meth:`clear`."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(("graph", "block"), 0.0)
        self.calls: dict[str, int] = dict.fromkeys(("graph", "block"), 0)

    def timed(self, part: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - started
                self.calls[part] += 1

        return run


def instrument(model: torch.nn.Module, clock: Clock) -> int:
    """Time every block call and every inductor graph call of ``model``;
    the number of blocks instrumented."""
    import torch._inductor.output_code as output_code

    graph_call = output_code.CompiledFxGraph.__call__
    output_code.CompiledFxGraph.__call__ = clock.timed("graph", graph_call)  # type: ignore[method-assign]
    state = state_of(model)
    if state is None:
        raise SystemExit("the model is not compiled by torchkiln")
    blocks = 0
    for region in state.regions:
        module = region.module
        forward = None if module is None else module.__dict__.get("forward")
        if forward is None:
            continue
        module.__dict__["forward"] = clock.timed("block", forward)
        blocks += 1
    return blocks


def split(wall: float, clock: Clock) -> dict[str, float]:
    graphs, blocks = clock.seconds["graph"], clock.seconds["block"]
    return {
        "graphs": graphs,
        "block call, rest": blocks - graphs,
        "outside the blocks": wall - blocks,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare-full", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    base = llama(depth=args.depth)
    inputs = example_inputs(base)
    regional = torchkiln.compile(copy.deepcopy(base), backend="inductor", progress="off")
    full = None
    if args.compare_full:
        full = copy.deepcopy(base)
        full.compile(backend="inductor")
    for model in (regional, full) if full is not None else (regional,):
        for _ in range(3):  # compile the prefill and the decode steps, then settle
            generate_once(model, inputs, args.new_tokens)

    clock = Clock()
    blocks = instrument(regional, clock)
    splits: list[dict[str, float]] = []
    per_token: dict[str, list[float]] = {"regional": [], "full": []}
    graph_calls = block_calls = 0
    for _ in range(args.rounds):
        clock.clear()
        started = time.perf_counter()
        token_clock, _ = generate_once(regional, inputs, args.new_tokens)
        splits.append(split(time.perf_counter() - started, clock))
        per_token["regional"].append(statistics.median(token_clock.decode_gaps()))
        graph_calls = clock.calls["graph"]
        block_calls = clock.calls["block"]
        if full is not None:
            full_clock, _ = generate_once(full, inputs, args.new_tokens)
            per_token["full"].append(statistics.median(full_clock.decode_gaps()))

    median = {part: statistics.median(s[part] for s in splits) for part in PARTS}
    total = sum(median.values())
    print(
        f"generate(max_new_tokens={args.new_tokens}) at depth {args.depth}, regional, inductor "
        f"({blocks} blocks; per call: {block_calls} block calls, "
        f"{graph_calls} graph calls), median of {args.rounds}:"
    )
    for part in PARTS:
        per_block = median[part] / block_calls * 1e6 if block_calls else 0.0
        print(
            f"  {part:20s} {median[part] * 1e3:8.2f} ms  {median[part] / total:6.1%}"
            f"  ({per_block:6.1f} us per block call)"
        )
    result: dict[str, Any] = {
        "depth": args.depth,
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        "block_calls": block_calls,
        "graph_calls": graph_calls,
        "median_seconds": median,
        "samples_seconds": splits,
        "per_token_seconds": {k: v for k, v in per_token.items() if v},
    }
    regional_token = statistics.median(per_token["regional"])
    if per_token["full"]:
        full_token = statistics.median(per_token["full"])
        result["regional_over_full_per_token"] = regional_token / full_token
        print(
            f"per decoded token: regional {regional_token * 1e3:.2f} ms, full "
            f"{full_token * 1e3:.2f} ms, x full {regional_token / full_token:.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
