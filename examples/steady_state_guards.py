"""Steady-state cost of region boundaries, and what torch's guard knobs take off it.

Times, in one process and in alternating rounds (so a busy machine slows all alike), the
built-in Llama example compiled whole, regionally, regionally with
guard filters, with guard evaluation skipped, and hierarchically; prints each median and its
ratio to full compile::

    python examples/steady_state_guards.py --depth 16 --batch 1 --rounds 40 [--json out.json]
    python examples/steady_state_guards.py --model llama-1b --device cuda --dtype bfloat16 \
        --variant full --variant regional --variant hierarchical

See docs/guide.md, "Steady state: the cost of a block boundary".
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import torchkiln
from torchkiln.examples import BUILDS_ON_DEVICE, example_inputs, load_model


def variants(base: nn.Module) -> dict[str, tuple[nn.Module, bool]]:
    """name -> (compiled copy, whether its calls run with guard evaluation skipped)."""
    c = torch.compiler

    def regional(**options: Callable[..., list[bool]]) -> nn.Module:
        extra = {"options": options} if options else {}
        return torchkiln.compile(copy.deepcopy(base), progress="off", **extra)

    return {
        "full": (torch.compile(copy.deepcopy(base)), False),
        "regional": (regional(), False),
        "regional, skip nn-module guards": (
            regional(guard_filter_fn=c.skip_guard_on_all_nn_modules_unsafe),
            False,
        ),
        "regional, skip global guards": (
            regional(guard_filter_fn=c.skip_guard_on_globals_unsafe),
            False,
        ),
        "regional, skip_guard_eval_unsafe": (regional(), True),
        "full, skip_guard_eval_unsafe": (torch.compile(copy.deepcopy(base)), True),
        "hierarchical": (
            torchkiln.compile(copy.deepcopy(base), regions="hierarchical", progress="off"),
            False,
        ),
    }


def timed_call(
    model: nn.Module, inputs: dict[str, torch.Tensor], skip_guards: bool, device: str
) -> float:
    synchronize = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    stance = (
        torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
        if skip_guards
        else contextlib.nullcontext()
    )
    with stance:
        synchronize()
        started = time.perf_counter()
        model(**inputs)
        synchronize()
        return time.perf_counter() - started


def build(args: argparse.Namespace) -> nn.Module:
    """The model in its dtype on its device (a model that builds on its device does so)."""
    dtype = getattr(torch, args.dtype)
    if args.model in BUILDS_ON_DEVICE:
        return load_model(args.model, device=args.device, dtype=dtype, depth=args.depth)
    return load_model(args.model, depth=args.depth).to(device=args.device, dtype=dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama", help="a built-in example (llama, llama-1b)")
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--variant", action="append", help="time this variant (repeat it; default: every one)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    base = build(args)
    inputs = {"input_ids": example_inputs(base, args.batch, args.seq).to(args.device)}
    models = variants(base)
    if args.variant:
        chosen = args.variant
        unknown = sorted(set(chosen) - set(models))
        if unknown:
            parser.error(f"unknown variants {unknown}; choose from {list(models)}")
        models = {name: models[name] for name in chosen}
    samples: dict[str, list[float]] = {name: [] for name in models}
    with torch.no_grad():
        for name, (model, _) in models.items():
            print(f"compiling: {name}", flush=True)
            for _ in range(3):
                model(**inputs)
        names = list(models)
        for round_index in range(args.rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                model, skip = models[name]
                samples[name].append(timed_call(model, inputs, skip, args.device))
    medians = {name: statistics.median(times) for name, times in samples.items()}
    reference = medians.get("full", next(iter(medians.values())))
    print(
        f"\n{args.model} depth {args.depth}, batch {args.batch}, seq {args.seq}, "
        f"{args.device} {args.dtype}, {args.rounds} rounds"
    )
    for name, median in medians.items():
        print(f"{name:36s} {median * 1e3:8.2f} ms   x full {median / reference:.3f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "settings": vars(args) | {"json": str(args.json)},
                    "median_s": medians,
                    "samples_s": samples,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
