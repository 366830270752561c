"""The ``hierarchical`` strategy: one graph for the whole model, repeated blocks compiled once as
``torch.compiler.nested_compile_region`` and stamped out at every call site."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo
from torch import nn

import torchkiln
from torchkiln.errors import ConfigError
from torchkiln.examples import example_inputs, llama, toy
from torchkiln.plugin import BackendSpec, Region, RegionGroup
from torchkiln.plugins import hierarchical
from torchkiln.testing import isolated_plugin_manager


@pytest.fixture(autouse=True)
def fresh_dynamo(reset_dynamo: None) -> None:
    """Graph counts in these tests are their own (the root conftest's ``reset_dynamo``)."""


class GraphCapture:
    """A real backend plugin that keeps every FX graph Dynamo hands it, then runs it eagerly."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    @torchkiln.hookimpl
    def declare_backends(self) -> list[BackendSpec]:
        return [BackendSpec("capture", "keeps Dynamo's graphs for inspection")]

    @torchkiln.hookimpl
    def compile_region(self, fn: Callable[..., Any], backend: str) -> Callable[..., Any] | None:

        def keep(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            self.graphs.append(gm)
            return gm.forward

        return torch.compile(fn, backend=keep)


def _invoke_subgraph_calls(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [
        n for n in gm.graph.nodes
        if n.op == "call_function" and n.target is torch.ops.higher_order.invoke_subgraph
    ]  # fmt: skip


def test_selector_is_declared() -> None:
    assert "hierarchical" in isolated_plugin_manager().selectors()


def test_plan_is_root_region_with_blocks_nested() -> None:
    model = llama(depth=3)
    plan = torchkiln.plan(model, backend="eager", regions="hierarchical",
                          plugins=isolated_plugin_manager())  # fmt: skip
    assert plan.selector == "hierarchical"
    assert [[r.path for r in g.regions] for g in plan.groups] == [[""]]
    assert plan.groups[0].regions[0].module is model
    assert [g.name for g in plan.nested] == ["LlamaDecoderLayer"]
    assert [r.path for r in plan.nested[0].regions] == [f"model.layers.{i}" for i in range(3)]
    assert "3x LlamaDecoderLayer" in plan.reason
    assert plan.to_dict()["nested"][0]["regions"] == [
        "model.layers.0",
        "model.layers.1",
        "model.layers.2",
    ]


def test_exclude_drops_blocks_from_nesting() -> None:
    plan = torchkiln.plan(llama(depth=3), backend="eager", plugins=isolated_plugin_manager(),
                          regions={"strategy": "hierarchical", "exclude": ["model.layers.2"]})  # fmt: skip
    assert [r.path for r in plan.nested[0].regions] == ["model.layers.0", "model.layers.1"]


def test_one_graph_with_the_block_traced_once_and_called_per_layer() -> None:
    depth = 4
    model = llama(depth=depth)
    inputs = example_inputs(model, batch=2, seq=16)
    with torch.no_grad():
        expected = model(inputs).logits
    capture = GraphCapture()
    torchkiln.compile(model, backend="capture", regions="hierarchical", progress="off",
                      plugins=isolated_plugin_manager(capture))  # fmt: skip
    with torch.no_grad():
        actual = model(inputs).logits
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    assert len(capture.graphs) == 1, "the whole model is one graph"
    calls = _invoke_subgraph_calls(capture.graphs[0])
    assert len(calls) == depth, "every decoder layer is a call of the nested region"
    # Stamped out: every call site uses the same traced subgraph.
    assert len({call.args[0].target for call in calls}) == 1


def test_outputs_and_gradients_match_eager_with_aot_eager() -> None:
    model = toy(depth=3).train()
    twin = copy.deepcopy(model)
    inputs = example_inputs(model, batch=2, seq=12)
    torchkiln.compile(model, backend="aot_eager", regions="hierarchical", progress="off",
                      plugins=isolated_plugin_manager())  # fmt: skip
    out, ref = model(inputs), twin(inputs)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    out.square().mean().backward()
    ref.square().mean().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    report = torchkiln.report(model)
    assert [(r.path, r.status, r.graphs) for r in report.regions] == [("", "compiled", 1)]


def test_decompile_removes_the_nested_marks() -> None:
    model = toy(depth=2)
    torchkiln.compile(model, backend="eager", regions="hierarchical", progress="off",
                      plugins=isolated_plugin_manager())  # fmt: skip
    assert all("forward" in layer.__dict__ for layer in model.layers)
    torchkiln.decompile(model)
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_a_torch_without_the_api_is_refused_by_name_and_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(torch.compiler, "nested_compile_region")
    model = llama(depth=2)
    forwards = [layer.forward for layer in model.model.layers]
    pm = isolated_plugin_manager()
    for call in (torchkiln.plan, torchkiln.compile):
        with pytest.raises(ConfigError) as refused:
            call(model, backend="eager", regions="hierarchical", plugins=pm)
        (problem,) = refused.value.problems
        assert problem.path == "$.regions.strategy"
        assert problem.message.startswith(
            "hierarchical compilation needs torch.compiler.nested_compile_region, which torch "
        )
    assert not torchkiln.is_compiled(model)
    assert [layer.forward for layer in model.model.layers] == forwards


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.ModuleList([Inner(), Inner()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.inner:
            x = block(x)
        return x


def _group(name: str, pairs: list[tuple[str, nn.Module]]) -> RegionGroup:
    return RegionGroup(name, tuple(Region(path, module, name) for path, module in pairs))


def test_a_nested_region_inside_another_is_refused() -> None:
    model = nn.Sequential(Outer(), Outer())
    outer = _group("Outer", [("0", model[0]), ("1", model[1])])
    inner = _group("Inner", [(f"{i}.inner.{j}", model[i].inner[j]) for i in (0, 1) for j in (0, 1)])
    with pytest.raises(hierarchical.NestedRegionError) as caught:
        hierarchical.check_not_nested((outer, inner))
    message = str(caught.value)
    assert "'0' (Outer) contains nested region '0.inner.0' (Inner)" in message
    assert "regions.exclude" in message
    hierarchical.check_not_nested((inner,))  # siblings only: accepted
    hierarchical.check_not_nested((outer,))


def test_mark_nested_refuses_bound_methods() -> None:
    block = Inner()
    with pytest.raises(torchkiln.TorchkilnError, match="not a bound method"):
        hierarchical.mark_nested(block.forward)
    assert callable(hierarchical.mark_nested(Inner.forward))


def test_every_block_runs_with_its_own_weights() -> None:
    """Regression: marking blocks through a bound method made torch 2.13 reuse the nested
    subgraph with the previous block's weights from the third block on."""
    model = toy(depth=5)
    inputs = example_inputs(model, batch=2, seq=6)
    with torch.no_grad():
        expected = model(inputs)
        torchkiln.compile(model, backend="eager", regions="hierarchical", progress="off",
                          plugins=isolated_plugin_manager())  # fmt: skip
        torch.testing.assert_close(model(inputs), expected, rtol=1e-5, atol=1e-5)


def test_the_docs_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "hierarchical.md").read_text()
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(example, "docs/hierarchical.md", "exec"), {})
    out = capsys.readouterr().out
    assert "nested_compile_region on the repeated blocks (4x LlamaDecoderLayer)" in out
    assert "<root>" in out
