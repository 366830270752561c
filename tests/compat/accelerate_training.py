"""A real Accelerate training run, with and without ``torchkiln.compat.accelerate.install()``.

Used in-process by ``test_accelerate_install.py`` and, as a script, under ``accelerate launch``
with 2 CPU processes by ``test_accelerate_launch.py``:

    accelerate launch --multi_gpu --num_processes 2 ... accelerate_training.py OUT_DIR

writes ``OUT_DIR/rank<N>.json`` with :func:`compare`'s result (or ``{"error": ...}``).
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch

STEPS = 2


def tiny_llama(seed: int = 0) -> torch.nn.Module:
    """``LlamaForCausalLM`` from its default config, only the sizes changed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    )
    return LlamaForCausalLM(config)


def batch(rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randint(0, 256, (2, 12), generator=generator)


def train(accelerator: Any, model: torch.nn.Module, out_dir: Path) -> dict[str, Any]:
    """``prepare`` -> ``STEPS`` SGD steps -> ``unwrap_model`` -> ``get_state_dict`` /
    ``save_model`` -> strict loads into a plain model. Returns what the tests compare."""
    from safetensors.torch import load_file

    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    prepared, optimizer = accelerator.prepare(model, optimizer)
    ids = batch(accelerator.process_index)
    losses = []
    for _ in range(STEPS):
        loss = prepared(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    unwrapped = accelerator.unwrap_model(prepared)
    state = accelerator.get_state_dict(prepared)
    accelerator.save_model(prepared, out_dir)
    accelerator.wait_for_everyone()
    saved = load_file(str(out_dir / "model.safetensors"))

    def loads_strictly(checkpoint: dict[str, torch.Tensor]) -> dict[str, Any]:
        plain = tiny_llama(seed=1)
        try:
            plain.load_state_dict(checkpoint, strict=True)
        except RuntimeError as error:
            return {"ok": False, "error": str(error).splitlines()[0]}
        with torch.no_grad():
            same = torch.allclose(plain(ids).logits, unwrapped(ids).logits, atol=1e-5)
        return {"ok": True, "same_logits": bool(same)}

    return {
        "prepared_type": type(prepared).__name__,
        "unwrapped_type": type(unwrapped).__name__,
        "unwrapped_is_model": unwrapped is model,
        "block_classes": sorted({type(layer).__name__ for layer in _layers(unwrapped)}),
        "losses": losses,
        "weight_sum": float(sum(p.detach().double().sum() for p in model.parameters())),
        "orig_mod_keys": sorted(k for k in state if "_orig_mod" in k),
        "state_dict_load": loads_strictly(state),
        "save_model_load": loads_strictly(saved),
        "regions": _regions(unwrapped),
    }


def _layers(model: torch.nn.Module) -> Any:
    # Accelerate's own unwrap_model returns its compiled copy of the DDP wrapper under DDP.
    while isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    return model.model.layers


def _regions(model: torch.nn.Module) -> list[list[str]]:
    import torchkiln

    if not torchkiln.is_compiled(model):
        return []
    return [[r["path"], r["status"]] for r in torchkiln.report(model).to_dict()["regions"]]


def compare(out_dir: Path) -> dict[str, Any]:
    """The same training with Accelerate's own regional compile, then with ``install()``; the
    dynamo settings come from the environment (``accelerate launch`` flags)."""
    from accelerate import Accelerator

    from torchkiln.compat.accelerate import install

    accelerator = Accelerator(cpu=True)
    theirs = train(accelerator, tiny_llama(), out_dir / "accelerate")
    with install():
        ours = train(accelerator, tiny_llama(), out_dir / "torchkiln")
    return {
        "distributed_type": str(accelerator.distributed_type),
        "dynamo": accelerator.state.dynamo_plugin.to_dict(),
        "accelerate": theirs,
        "torchkiln": ours,
    }


def main(out_dir: Path) -> None:
    from accelerate import PartialState

    state = PartialState(cpu=True)  # first: the process state is fixed by its first creation
    rank = state.process_index
    try:
        result: dict[str, Any] = compare(out_dir)
    except Exception:
        result = {"error": traceback.format_exc()}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    with contextlib.suppress(Exception):
        state.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()))
