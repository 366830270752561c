"""``torchkiln precompile MODEL --output DIR``: write precompiled region entries into a store."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from torchkiln.artifacts.directory import KINDS
from torchkiln.errors import TorchkilnError


def add_precompile_parser(commands: Any) -> None:
    p = commands.add_parser(
        "precompile",
        help="compile each region group ahead of time into a store",
        description="Compile MODEL's region groups for example inputs (token ids of --batch x "
        "--seq, or the module's own example_inputs(model, batch, seq)) and write DIR; "
        "torchkiln.compile(model, artifacts=DIR) then loads them without tracing or compiling. "
        "Exit status 1 when some group could not be precompiled (listed).",
    )
    p.add_argument(
        "model", help="llama[:DEPTH], gpt2[:DEPTH], toy[:DEPTH] or package.module:factory"
    )
    p.add_argument("--output", "-o", required=True, help="artifact directory to write")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help="inference, training or both (default: inference,training)",
    )
    p.add_argument("--backend", help="compile backend (default from configuration: inductor)")
    p.add_argument("--mode", help="torch.compile mode")
    p.add_argument("--device", default="cpu", help="device to build and compile on")
    p.add_argument("--dtype", help="cast the model to this floating dtype (bfloat16, ...)")
    p.add_argument("--config", help="YAML file")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.add_argument(
        "--whole",
        action="store_true",
        help="also compile the whole model (preferred by compile(artifacts=DIR); docs/tiered.md)",
    )
    p.set_defaults(handler=_precompile)


def _inputs(spec: str, model: Any, batch: int, seq: int) -> Any:
    from torchkiln.examples import EXAMPLES, example_inputs

    name, _, _ = spec.partition(":")
    make = example_inputs
    if name not in EXAMPLES:
        make = getattr(importlib.import_module(name), "example_inputs", example_inputs)
    return make(model, batch, seq)


def _device(name: str) -> Any:
    """``--device`` as a torch device that exists here, else a clear error."""
    import torch

    try:
        device = torch.device(name)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise TorchkilnError(f"--device {name!r}: not a usable device here ({first})") from error
    return device


def _precompile(args: argparse.Namespace) -> int:
    import torch

    import torchkiln
    from torchkiln.examples import check_tokens, load_model

    check_tokens(args.batch, args.seq)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    device = _device(args.device)
    model = load_model(args.model).to(device)
    check_tokens(args.batch, args.seq, model)
    if args.dtype:
        dtype = getattr(torch, args.dtype, None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TorchkilnError(f"--dtype {args.dtype!r}: expected float32, bfloat16, float16")
        model = model.to(dtype)
    inputs = _inputs(args.model, model, args.batch, args.seq)
    inputs = inputs.to(args.device) if hasattr(inputs, "to") else inputs
    options = {k: v for k, v in (("backend", args.backend), ("mode", args.mode)) if v}
    result = torchkiln.precompile(
        model,
        inputs,
        args.output,
        args.config,
        kinds=kinds,
        whole=args.whole,
        progress="off",
        **options,
    )
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.summary())
    if not result.entries:
        print("torchkiln: error: nothing could be precompiled", file=sys.stderr)
        return 1
    return 1 if result.skipped else 0
