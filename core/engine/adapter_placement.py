"""LoRA adapters outside the repeated blocks: said once, when the model is compiled.

PEFT's hot-swap (``hotswap_adapter`` after ``prepare_model_for_compiled_hotswap``) copies a new
adapter's weights into the tensors the compiled code already reads, so a regionally compiled
model serves another adapter without compiling again. An adapter on a module outside the
repeated blocks (``lm_head``, the embeddings) is compiled only where the plan has a region
for it, and otherwise runs eagerly: a user serving many adapters should know which. Under
``regions.rest=leaves`` the layer itself is no region but its weighted parts are (the base
layer, each adapter's ``lora_A``/``lora_B``): those run compiled, the LoRA forward that joins
them runs eagerly (and so do weights no region holds, PEFT's ``lora_embedding_A``/``_B``
parameter dicts), and the warning says exactly that.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence

from torch import nn

from torchkiln.plugin_host.region_plan import RegionPlan


class AdapterPlacementWarning(UserWarning):
    """A LoRA adapter targets modules outside the model's repeated blocks."""


def adapter_layers(model: nn.Module) -> Iterator[str]:
    """Paths of PEFT's LoRA layers in ``model``: modules holding ``lora_A`` (a ``ModuleDict``
    of the adapters by name) beside the ``base_layer`` they wrap; imports nothing."""
    for path, module in model.named_modules():
        lora = getattr(module, "lora_A", None)
        if isinstance(lora, nn.ModuleDict) and isinstance(
            getattr(module, "base_layer", None), nn.Module
        ):
            yield path


def _inside(path: str, region: str) -> bool:
    return region == "" or path == region or path.startswith(region + ".")


def _where_it_runs(model: nn.Module, path: str, regions: Sequence[str]) -> str:
    """How the LoRA layer at ``path`` runs: inside a region, in regions of its parts, or eager."""
    if any(_inside(path, r) for r in regions):
        return "compiled in a region of its own"
    prefix = path + "."
    parts = [r.removeprefix(prefix) for r in regions if r.startswith(prefix)]
    if not parts:
        return "eager"
    eager = ["the LoRA forward that joins them"] + [
        name
        for name, module in model.get_submodule(path).named_modules()
        if name
        and next(module.parameters(recurse=False), None) is not None
        and not any(_inside(prefix + name, r) for r in regions)
    ]
    return f"compiled in leaf regions: {', '.join(parts)}; eager: {', '.join(eager)}"


def warn_adapters_outside_blocks(model: nn.Module, plan: RegionPlan) -> list[str]:
    """Warn (:class:`AdapterPlacementWarning`) about LoRA layers outside every repeated block,
    each with where it runs: in a region of its own (compiled), as leaf regions of its parts
    (``regions.rest=leaves``), or eagerly. Returns the line
    the report keeps (none: every adapter layer is inside a block)."""
    blocks = [r.path for g in plan.groups if len(g.regions) > 1 for r in g.regions]
    if not blocks:  # compiled whole, or nothing repeated: no block to be outside of
        return []
    regions = [r.path for r in plan.regions()]
    outside = [p for p in adapter_layers(model) if not any(_inside(p, b) for b in blocks)]
    if not outside:
        return []
    where = [f"{p} ({_where_it_runs(model, p, regions)})" for p in outside]
    line = f"LoRA adapter layers outside the repeated blocks: {', '.join(where)}"
    warnings.warn(
        f"{line}. Hot-swapping adapters still compiles nothing new; the parts named eager run "
        "uncompiled (docs/migrating-from-accelerate.md#lora-adapters).",
        AdapterPlacementWarning,
        stacklevel=4,
    )
    return [line]
