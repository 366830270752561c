"""A form that misses a call keeps serving every later call it fits (issue 41).

Process 1 builds the whole-model form into a store with the real builder; process 2 names the
store and calls fit, fit, miss, fit, fit, fit (the miss: batch 3, the form was built for batch
1). The witness is independent of torchkiln's counts: forward pre-hooks on the blocks fire only
when the blocks run regionally (the whole-model form does not call them), so each call's hook
count says which form served it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from json_scripts import run_json_script

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch, torchkiln, torchkiln.tiered
    sys.path.insert(0, sys.argv[4])
    from tiered_models import tiny_llama

    store, phase, backend = sys.argv[1], sys.argv[2], sys.argv[3]
    model = tiny_llama()
    reference = tiny_llama()
    torchkiln.compile(model, store=store, backend=backend,
                      tiered={"enabled": True, "when": "always", "max_slowdown": 0})
    installed = [layer.__dict__["forward"] for layer in model.model.layers]
    fit = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(1))
    miss = torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(2))
    fired = [0]
    if phase != "build":  # hooks would travel to the builder, which cannot pickle them
        for layer in model.model.layers:
            layer.register_forward_pre_hook(lambda m, a: fired.__setitem__(0, fired[0] + 1))
    block_calls, exact = [], True
    with torch.no_grad():
        if phase == "build":
            model(fit)
            assert torchkiln.tiered.wait(model, 600)
            calls = [fit]
        else:
            calls = [fit, fit, miss, fit, fit, fit]
        for ids in calls:
            fired[0] = 0
            out = model(ids).logits
            block_calls.append(fired[0])
            exact &= torch.allclose(out, reference(ids).logits, atol=1e-4)
    tiers = torchkiln.tiered.tiers(model)
    print(json.dumps({
        "block_calls": block_calls,
        "exact": bool(exact),
        "calls": tiers.calls,
        "misses": tiers.misses,
        "state": tiers.state,
        "source": tiers.source,
        "loaded_from": tiers.loaded_from,
        "reason": tiers.reason,
        "forwards_kept": all(
            layer.__dict__["forward"] is f for layer, f in zip(model.model.layers, installed)
        ),
        "report": str(torchkiln.report(model)),
    }))
    """
)


def _run(store: Path, tmp_path: Path, phase: str, backend: str) -> dict[str, object]:
    here = str(Path(__file__).resolve().parent)
    return run_json_script(tmp_path, "fit_and_miss.py", SCRIPT, str(store), phase, backend, here)


@pytest.mark.needs_feature("tiered compilation")
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_the_whole_model_form_serves_every_call_it_fits_after_a_miss(tmp_path, backend):
    store = tmp_path / "store"
    built = _run(store, tmp_path, "build", backend)
    assert (built["state"], built["source"]) == ("serving", "the builder"), built["report"]
    assert built["exact"]

    second = _run(store, tmp_path, "serve", backend)
    assert second["exact"], second["report"]
    # The witness: the blocks ran (regionally) for the miss only, 2 blocks.
    assert second["block_calls"] == [0, 0, 2, 0, 0, 0], second["report"]
    # torchkiln's counts say the same.
    assert second["calls"] == {"regional": 1, "whole-model": 5}
    assert second["misses"] == 1 and second["state"] == "serving" and second["loaded_from"]
    assert second["source"] == second["loaded_from"]  # found in the store at compile time
    assert "size mismatch at index 0. expected 1, actual 3" in str(second["reason"])
    assert "calls regional 1, whole-model 5" in str(second["report"])
    assert "1 call missed the whole-model form" in str(second["report"])
    assert "missed 1: a call did not fit: inference: tensor" in str(second["report"])
    assert second["forwards_kept"] is True
