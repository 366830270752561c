"""Serving mode: warm the calls up, freeze, and no call compiles any more."""

import warnings

import torch

import torchkiln
from torchkiln.engine.serving import UncoveredCallWarning
from torchkiln.examples import llama

model = llama(depth=2, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128, vocab_size=256)
torchkiln.compile(model, backend="eager")


def tokens(batch: int) -> torch.Tensor:
    return torch.randint(0, 256, (batch, 16), generator=torch.Generator().manual_seed(batch))


with torch.no_grad():
    model(tokens(1))  # warm-up: every call family the server will see
    torchkiln.freeze(model)  # from here on, Dynamo compiles nothing for this model
    model(tokens(1))  # served by the code compiled during the warm-up
    try:
        model(tokens(4))  # a batch size the warm-up never saw
    except torchkiln.UncoveredCallError as error:
        print(error)  # ... region 'model.layers.0' (group 'LlamaDecoderLayer'): tensor ...
        assert "expected 1, actual 4" in error.guards[0]

    # Or keep serving: uncovered calls run eagerly, one warning per group.
    torchkiln.freeze(model, on_miss="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(tokens(4))
        model(tokens(4))
    assert [w.category for w in caught] == [UncoveredCallWarning]

print(torchkiln.report(model).frozen)  # frozen (on_miss='eager'): 4 region calls no compiled ...
torchkiln.decompile(model)
