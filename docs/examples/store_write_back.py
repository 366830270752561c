"""A call no stored entry fits is written to the store too: the next run serves it."""

import shutil
import tempfile

import torch

import torchkiln
from torchkiln.examples import llama


def fresh_model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same weights each time, as a restarted script loads them
    return llama(
        depth=2, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128, vocab_size=256
    )


def one_run(store: str):  # -> the run's torchkiln.report
    """A training step on batches of 4, then an evaluation on the last, short batch of 3."""
    model = torchkiln.compile(
        fresh_model(), backend="aot_eager", store=store, tiered={"enabled": False}
    )
    model.train()
    model(torch.randint(0, 256, (4, 16))).logits.sum().backward()
    model.eval()
    with torch.no_grad():
        model(torch.randint(0, 256, (3, 16)))
    report = torchkiln.report(model)
    torchkiln.decompile(model)
    return report


store = tempfile.mkdtemp(prefix="torchkiln-store-")

# The first run: the blocks' group is compiled for its first call (training) and stored. The
# evaluation does not fit that entry: the first block's call is compiled into a second entry of
# the store, which the second block's call then fits. A group's calls are its blocks' calls.
first = one_run(store)
[blocks] = first.job.groups
print(first.job.lines()[1])  # ...; 1 of 4 calls did not fit it and were compiled here (1 into ...
assert (blocks.fitted_calls, blocks.other_calls, blocks.written) == (3, 1, 1)

# The next run: every call fits an entry of the store; nothing is compiled.
second = one_run(store)
[blocks] = second.job.groups
print(second.job.lines()[1])  # LlamaDecoderLayer: serving from store, ... (compile 0.0 s, ...
assert (blocks.role, blocks.fitted_calls, blocks.other_calls, blocks.written) == ("store", 4, 0, 0)
shutil.rmtree(store)
