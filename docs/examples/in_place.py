"""What "in place" keeps: the object, its class, indexing, state-dict keys, hooks, checkpoints,
copies; and what decompile gives back."""

import copy
import io

import torch

import torchkiln
from torchkiln.examples import example_inputs, toy

model = toy(depth=3)  # nn.TransformerEncoderLayer blocks in an nn.ModuleList
keys = list(model.state_dict())
seen = []
hook = model.layers[1].register_forward_hook(lambda module, args, output: seen.append("hook"))

same = torchkiln.compile(model, backend="eager")
assert same is model and type(model.layers[1]) is torch.nn.TransformerEncoderLayer
assert list(model.state_dict()) == keys  # no _orig_mod. anywhere
inputs = example_inputs(model, batch=2, seq=8)
with torch.no_grad():
    out = model(inputs)
assert seen == ["hook"]  # hooks run, eagerly, around the compiled forward
hook.remove()

# A checkpoint from the compiled model loads into a plain one (strict), and back.
buffer = io.BytesIO()
torch.save(model.state_dict(), buffer)
buffer.seek(0)
plain = toy(depth=3)
plain.load_state_dict(torch.load(buffer), strict=True)
with torch.no_grad():
    torch.testing.assert_close(plain(inputs), out)

# A deep copy is compiled too, and runs its own weights.
twin = copy.deepcopy(model)
assert torchkiln.is_compiled(twin)

# Whole-model pickling saves the plain model.
saved = io.BytesIO()
torch.save(model, saved)
saved.seek(0)
assert not torchkiln.is_compiled(torch.load(saved, weights_only=False))

torchkiln.decompile(model)
assert not any("forward" in module.__dict__ for module in model.modules())
torch.save(model, io.BytesIO())
print("decompiled; state-dict keys unchanged:", list(model.state_dict()) == keys)
