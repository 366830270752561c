"""Which modules are compiled: the selectors side by side, with plan() only."""

import torchkiln
from torchkiln.examples import llama

model = llama(depth=3, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128, vocab_size=256)


def regions(**options: object) -> list[str]:
    plan = torchkiln.plan(model, backend="eager", **options)
    return [region.path for region in plan.regions()]


# auto (the default): the repeated blocks when there are any, else the whole model.
assert regions() == ["model.layers.0", "model.layers.1", "model.layers.2"]

# ... and the rest of the model's leaves too, each compiled on its own.
assert regions(regions={"rest": "leaves"}) == [
    "model.layers.0",
    "model.layers.1",
    "model.layers.2",
    "model.embed_tokens",
    "model.norm",
    "lm_head",
]

# exclude: never compiled, whatever the strategy (globs on module paths).
assert regions(regions={"exclude": ["model.layers.0"]}) == ["model.layers.1", "model.layers.2"]

# whole: one region, the root (shown as <root>).
assert regions(regions="whole") == [""]

# classes: class-name globs (the bare name or the qualified one).
assert regions(regions={"strategy": "classes", "classes": ["*DecoderLayer", "*.LlamaRMSNorm"]}) == [
    "model.layers.0",
    "model.layers.1",
    "model.layers.2",
    "model.norm",
]

# paths: module-path globs.
assert regions(regions={"strategy": "paths", "paths": ["model.layers.[02]", "lm_head"]}) == [
    "model.layers.0",
    "model.layers.2",
    "lm_head",
]

plan = torchkiln.plan(model, backend="eager", regions={"rest": "leaves"})
for group in plan.to_dict()["groups"]:
    print(f"{group['name']:18} {len(group['regions'])} region(s): {group['reason']}")
