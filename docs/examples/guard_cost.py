"""Every compiled block is a Dynamo frame whose guards are checked on each call. torch's guard
filters drop guards you know cannot change; "unsafe" means a change is then no longer seen."""

import torch
from torch import nn

import torchkiln

SCALE = 1.0  # a global the blocks read: Dynamo guards on its value


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + SCALE * torch.tanh(self.linear(x))


def stack() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(Block() for _ in range(4)))


filtered: list[int] = []


def skip_global_guards(entries: list) -> list[bool]:
    """What torch.compiler.skip_guard_on_globals_unsafe does, counting the guards it sees."""
    filtered.append(sum(entry.is_global for entry in entries))
    return [not entry.is_global for entry in entries]


x = torch.randn(2, 16)
with torch.no_grad():
    guarded = torchkiln.compile(stack(), backend="eager")
    unguarded = torchkiln.compile(
        stack(), backend="eager", options={"guard_filter_fn": skip_global_guards}
    )
    before = stack()(x)
    torch.testing.assert_close(guarded(x), before)
    torch.testing.assert_close(unguarded(x), before)
    print("global guards dropped for the one group:", filtered)
    assert len(filtered) == 1 and filtered[0] > 0  # one group compiled, its global guards gone

    SCALE = 0.0  # the guarded model sees it (it recompiles); the unguarded one does not
    torch.testing.assert_close(guarded(x), x)
    torch.testing.assert_close(unguarded(x), before)
    print("after SCALE = 0: guarded follows it, unguarded keeps the value it compiled with")

    # Skip guard evaluation altogether for a stretch of calls (a serving loop whose inputs
    # never change shape): the cached graph runs without any check.
    SCALE = 1.0
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        torch.testing.assert_close(guarded(x), before)
    print("skip_guard_eval_unsafe: same output, no guard checked")
