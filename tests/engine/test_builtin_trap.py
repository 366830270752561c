"""The torch.nn built-in trap: up to torch 2.13, ``nn.Module.compile()`` on ``nn.Linear``,
``nn.Sequential`` or ``nn.TransformerEncoderLayer`` compiles nothing (Dynamo skips a top frame
whose code lives in ``torch/nn``); torch 2.14 compiles them. torchkiln compiles them for real on
every release, keeping class, indexing and state-dict keys. Graphs are counted, not assumed."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from engine_zoo import graphs_compiled
from torch import nn

import torchkiln
from torchkiln._internals import versions

BUILTINS: dict[str, Callable[[], nn.Module]] = {
    "Linear": lambda: nn.Linear(16, 16),
    "Sequential": lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)),
    "TransformerEncoderLayer": lambda: nn.TransformerEncoderLayer(
        16, 2, dim_feedforward=32, dropout=0.0, batch_first=True
    ),
}


@pytest.fixture(params=sorted(BUILTINS), ids=str)
def builtin(request: pytest.FixtureRequest) -> nn.Module:
    torch.manual_seed(0)
    return BUILTINS[request.param]().eval()


def inputs() -> torch.Tensor:
    return torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))


def test_module_compile_on_builtins_compiles_what_the_release_says(builtin: nn.Module) -> None:
    """The trap itself, per release (``versions.module_compile_skips_torch_nn``): if this fails,
    torch changed it (and the adapter and the docs should say so)."""
    builtin.compile(backend="eager")
    builtin(inputs())
    if versions.module_compile_skips_torch_nn():
        assert graphs_compiled() == 0
    else:
        assert graphs_compiled() >= 1


def test_torchkiln_compiles_builtins_in_place(builtin: nn.Module) -> None:
    twin = copy.deepcopy(builtin)
    cls, keys = type(builtin), list(builtin.state_dict())

    assert torchkiln.compile(builtin, backend="eager", regions="whole", progress="off") is builtin
    torch.testing.assert_close(builtin(inputs()), twin(inputs()))
    assert graphs_compiled() >= 1
    assert type(builtin) is cls
    assert list(builtin.state_dict()) == keys
    [region] = torchkiln.report(builtin).regions
    assert region.path == "" and region.status == "compiled" and region.graphs >= 1
    if isinstance(builtin, nn.Sequential):
        assert isinstance(builtin[0], nn.Linear) and builtin[0] is builtin._modules["0"]
        assert len(builtin) == 3 and isinstance(builtin[1:], nn.Sequential)


def test_builtin_blocks_in_a_stack_share_one_graph() -> None:
    """``nn.TransformerEncoderLayer`` blocks found by ``auto``: one graph for four blocks."""
    import torchkiln.examples

    model = torchkiln.examples.toy(depth=4)
    twin = copy.deepcopy(model)
    torchkiln.compile(model, backend="eager", progress="off")
    ids = torchkiln.examples.example_inputs(model, 2, 8)

    torch.testing.assert_close(model(ids), twin(ids))
    assert graphs_compiled() == 1
    assert isinstance(model.layers[2], nn.TransformerEncoderLayer)
    assert [r.reused for r in torchkiln.report(model).regions] == [False, True, True, True]
