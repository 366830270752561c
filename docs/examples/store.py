"""One store: what a run compiles lands in one directory, and the next run starts from it."""

import shutil
import tempfile

import torch

import torchkiln
import torchkiln.tiered
from torchkiln.examples import example_inputs, llama


def fresh_model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same weights each time, as a restarted script loads them
    return llama(
        depth=2, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128, vocab_size=256
    )


store = tempfile.mkdtemp(prefix="torchkiln-store-")
inputs = example_inputs(fresh_model(), batch=1, seq=16)
with torch.no_grad():
    expected = fresh_model()(inputs).logits

# The first run: regional at once, a builder compiles the whole model beside it. A store turns
# the tiers on by itself; "always" because this example waits for the builder (auto decides by
# the cores left free), "enabled" so that a torch without tiers refuses it by name.
tiered_options = {"enabled": True, "when": "always"}
model = torchkiln.compile(fresh_model(), backend="aot_eager", store=store, tiered=tiered_options)
with torch.no_grad():
    torch.testing.assert_close(model(inputs).logits, expected)
    torchkiln.tiered.wait(model)  # a real run simply goes on
    torch.testing.assert_close(model(inputs).logits, expected)  # now the whole-model form
torchkiln.decompile(model)

# The next run (a restarted script, another rank, another node sharing the directory): the
# same call, nothing else to do. It starts from the whole-model form the first run stored.
model = torchkiln.compile(fresh_model(), backend="aot_eager", store=store, tiered=tiered_options)
with torch.no_grad():
    torch.testing.assert_close(model(inputs).logits, expected)
tiers = torchkiln.tiered.tiers(model)
print(
    "\n".join(tiers.lines())
)  # tiers: whole-model form serving from STORE/whole/...; ... loaded from STORE/whole/...
assert tiers.state == "serving" and tiers.calls == {"regional": 0, "whole-model": 1}
assert tiers.loaded_from.startswith(store)
torchkiln.decompile(model)
shutil.rmtree(store)
