"""Compile a small Llama region by region, in place, then read the report and undo it."""

import torch

import torchkiln
from torchkiln.examples import example_inputs, llama

model = llama(depth=4, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128, vocab_size=256)
inputs = example_inputs(model, batch=2, seq=16)
with torch.no_grad():
    expected = model(inputs).logits

plan = torchkiln.plan(model, backend="eager")
print(plan.reason)  # auto: repeated blocks found: 4x LlamaDecoderLayer; level: ...

compiled = torchkiln.compile(model, backend="eager")
assert compiled is model  # the same object, compiled in place
with torch.no_grad():
    torch.testing.assert_close(model(inputs).logits, expected)  # the first call compiles

report = torchkiln.report(model)
print(report)
assert report.total_graphs == 1  # one graph for four blocks
assert [r.reused for r in report.regions] == [False, True, True, True]

torchkiln.decompile(model)  # every forward back as it was
assert not torchkiln.is_compiled(model)
