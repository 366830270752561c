"""Tiered compilation: regional first, then the whole model, switched in place between calls."""

import torch

import torchkiln
import torchkiln.tiered
from torchkiln.examples import example_inputs, llama

model = llama(depth=2, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128, vocab_size=256)
inputs = example_inputs(model, batch=1, seq=16)
with torch.no_grad():
    expected = model(inputs).logits

# This example waits for the builder (an idle foreground): start it whatever auto would say
model = torchkiln.compile(model, backend="aot_eager", tiered={"enabled": True, "when": "always"})
with torch.no_grad():
    for _ in range(2):  # regional: the first call compiles one block and starts a builder
        torch.testing.assert_close(model(inputs).logits, expected)
    print(torchkiln.tiered.tiers(model).state)  # pending (a builder started: builds == 1)
    torchkiln.tiered.wait(model)  # a training loop would simply go on; this example waits
    torch.testing.assert_close(model(inputs).logits, expected)  # served by the whole-model form

tiers = torchkiln.tiered.tiers(model)
print("\n".join(tiers.lines()))  # tiers: whole-model form serving from the builder; calls ...
assert tiers.serving == "whole-model" and tiers.calls == {"regional": 2, "whole-model": 1}
torchkiln.decompile(model)  # stops a builder still running; the root's forward is plain again
