"""Tiered compilation with inductor, checked against the profiler: before the switch every
block call runs its own compiled graph, after it one graph serves the whole model.

Also the artifact path: ``precompile(whole=True)`` in one process, and a new process whose
``compile(artifacts=DIR)`` serves from the whole-model form on its first call.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from tiered_models import tiny_llama

import torchkiln
import torchkiln.tiered

pytestmark = pytest.mark.slow


def _compiled_graph_calls(model, inputs) -> int:
    """Inductor's own profiler ranges, one per compiled graph it runs."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof, torch.no_grad():
        model(inputs)
    return sum(1 for e in prof.events() if "CompiledFxGraph" in e.name)


@pytest.mark.needs_feature("tiered compilation")
def test_the_profiler_sees_one_graph_per_block_then_one_for_the_model(tokens):
    depth = 4
    model = torchkiln.compile(
        tiny_llama(depth), backend="inductor", tiered={"enabled": True, "when": "always"}
    )
    with torch.no_grad():
        model(tokens)
        model(tokens)
    regional = _compiled_graph_calls(model, tokens)
    assert torchkiln.tiered.wait(model, 900)
    with torch.no_grad():
        model(tokens)  # the switch
    whole = _compiled_graph_calls(model, tokens)
    tiers = torchkiln.tiered.tiers(model)
    assert tiers.serving == "whole-model", tiers.reason
    assert regional == depth  # one graph per block: outside them runs eagerly
    assert whole == 1
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).logits, tiny_llama(depth)(tokens).logits)


LOADER = textwrap.dedent(
    """
    import sys, torch, torchkiln, torchkiln.tiered
    sys.path.insert(0, sys.argv[2])
    from tiered_models import tiny_llama
    tokens = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(1))
    model = torchkiln.compile(tiny_llama(), backend="inductor", artifacts=sys.argv[1])
    with torch.no_grad():
        out = model(tokens).logits
    tiers = torchkiln.tiered.tiers(model)
    assert tiers.state == "serving" and tiers.loaded_from is not None and tiers.calls == {"regional": 0, "whole-model": 1}, tiers
    with torch.no_grad():
        torch.testing.assert_close(out, tiny_llama()(tokens).logits)
    print("served whole-model", tiers.load_seconds)
    """
)


@pytest.mark.needs_feature("precompiled artifacts")
@pytest.mark.needs_feature("tiered compilation")
def test_a_new_process_starts_at_whole_model_speed_from_precompiled_artifacts(tmp_path, tokens):
    result = torchkiln.precompile(
        tiny_llama(),
        tokens,
        tmp_path / "artifacts",
        backend="inductor",
        kinds=["inference"],
        whole=True,
    )
    assert [e.kind for e in result.whole] == ["inference"]
    assert "the whole model, inference" in result.summary()
    tests_dir = str(__import__("pathlib").Path(__file__).parent)
    done = subprocess.run(
        [sys.executable, "-c", LOADER, str(tmp_path / "artifacts"), tests_dir],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "served whole-model" in done.stdout
