"""Contracts of ``torchkiln._internals.nn_module``: each adapter function works on this torch."""

from __future__ import annotations

from torch import nn

from torchkiln._internals import nn_module


def test_child_modules() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    children = nn_module.child_modules(model)
    assert list(children) == ["0", "1"]
    replacement = nn.Tanh()
    children["1"] = replacement  # the live dict: the model's child changes
    assert model[1] is replacement
    model.register_module("gap", None)
    assert nn_module.child_modules(model)["gap"] is None


def test_own_parameters() -> None:
    layer = nn.Linear(2, 2, bias=False)
    found = nn_module.own_parameters(layer)
    assert found["weight"] is layer.weight
    assert "bias" in found and found["bias"] is None
    assert nn_module.own_parameters(nn.Sequential(layer)) == {}


def test_own_buffers() -> None:
    norm = nn.BatchNorm1d(2)
    found = nn_module.own_buffers(norm)
    assert found["running_mean"] is norm.running_mean
    norm.register_buffer("empty", None)
    assert nn_module.own_buffers(norm)["empty"] is None
