"""The region error policy, with a backend plugin that fails on purpose: ``raise`` names the
region and group; ``eager`` runs that region eagerly, keeps the others compiled, and the report
says which and why."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from engine_zoo import HybridModel, NestedListModel, graphs_compiled, token_ids

import torchkiln
from torchkiln.engine.region_runtime import RegionFallbackWarning, eager_forward
from torchkiln.plugin import BackendSpec, RegionGroup

BOOM = "the broken backend refuses this graph"


def refusing_backend(graph_module: torch.fx.GraphModule, example_inputs: Any) -> Any:
    raise RuntimeError(BOOM)


class BrokenBackend:
    """Declares backend ``broken``: Dynamo traces, then the backend raises (at first call). With
    ``fail_groups``, only those groups fail and the others compile with ``eager``."""

    def __init__(self, fail_groups: tuple[str, ...] | None = None, at_compile: bool = False):
        self.fail_groups = fail_groups
        self.at_compile = at_compile

    @torchkiln.hookimpl
    def declare_backends(self) -> list[BackendSpec]:
        return [BackendSpec("broken", "fails on purpose (tests)")]

    @torchkiln.hookimpl
    def compile_region(
        self, fn: Callable[..., Any], group: RegionGroup, backend: str
    ) -> Callable[..., Any] | None:
        if backend != "broken":
            return None
        if self.fail_groups is not None and group.name not in self.fail_groups:
            return torch.compile(fn, backend="eager")
        if self.at_compile:
            raise RuntimeError(f"cannot compile group {group.name}")
        return torch.compile(fn, backend=refusing_backend)


def manager(plugin: BrokenBackend) -> torchkiln.PluginManager:
    pm = torchkiln.PluginManager(entry_points=False, env={})
    pm.register(plugin, name="broken-backend")
    return pm


def test_raise_policy_names_region_and_group() -> None:
    model = NestedListModel().eval()
    torchkiln.compile(model, backend="broken", plugins=manager(BrokenBackend()), progress="off")

    with pytest.raises(torchkiln.RegionCompileError) as caught:
        model(token_ids())
    assert caught.value.path == "stages.0.0"
    assert caught.value.group == "MlpBlock"
    message = str(caught.value)
    assert "'stages.0.0'" in message and "'MlpBlock'" in message and BOOM in message
    assert "on_region_error='eager'" in message  # says how to degrade instead
    assert torchkiln.report(model).regions[0].status == "failed"


def test_raise_policy_at_compile_time() -> None:
    """A ``compile_region`` that raises fails ``torchkiln.compile`` itself under ``raise``."""
    model = NestedListModel().eval()
    with pytest.raises(
        torchkiln.RegionCompileError, match="cannot compile group MlpBlock"
    ) as caught:
        torchkiln.compile(
            model, backend="broken", plugins=manager(BrokenBackend(at_compile=True)), progress="off"
        )
    assert caught.value.group == "MlpBlock"


def test_eager_policy_runs_failing_regions_eagerly(recwarn: pytest.WarningsRecorder) -> None:
    model = NestedListModel().eval()
    twin = copy.deepcopy(model)
    torchkiln.compile(
        model, backend="broken", on_region_error="eager", plugins=manager(BrokenBackend()),
        progress="off",
    )  # fmt: skip

    blocks = [block for stage in model.stages for block in stage]
    installed = [block.__dict__["forward"] for block in blocks]
    ids = token_ids()
    torch.testing.assert_close(model(ids), twin(ids))
    torch.testing.assert_close(model(ids), twin(ids))  # and again, a later call
    report = torchkiln.report(model)
    assert [r.status for r in report.regions] == ["eager"] * 4
    assert all(BOOM in (r.fallback_reason or "") for r in report.regions)
    # The runtime compile installed stays; it runs each block's own forward now.
    assert all(b.__dict__["forward"] is f for b, f in zip(blocks, installed, strict=True))
    assert all(f.run is eager_forward for f in installed)
    caught = [w for w in recwarn if issubclass(w.category, RegionFallbackWarning)]
    assert any("stages.0.0" in str(w.message) for w in caught)  # said in a warning too
    assert BOOM in str(report)


def test_eager_policy_keeps_the_other_group_compiled() -> None:
    model = HybridModel().eval()
    twin = copy.deepcopy(model)
    plugin = BrokenBackend(fail_groups=("AttnBlock",))
    torchkiln.compile(
        model, backend="broken", on_region_error="eager", plugins=manager(plugin), progress="off"
    )

    ids = token_ids()
    torch.testing.assert_close(model(ids), twin(ids))
    by_path = {r.path: r for r in torchkiln.report(model).regions}
    assert [by_path[p].status for p in ("layers.0", "layers.2")] == ["eager", "eager"]
    assert by_path["layers.1"].status == "compiled" and by_path["layers.1"].graphs == 1
    assert by_path["layers.3"].status == "compiled" and by_path["layers.3"].reused
    assert graphs_compiled() == 1  # MlpBlock's; AttnBlock's backend never produced one


def test_eager_policy_at_compile_time() -> None:
    model = HybridModel().eval()
    twin = copy.deepcopy(model)
    plugin = BrokenBackend(fail_groups=("MlpBlock",), at_compile=True)
    torchkiln.compile(
        model, backend="broken", on_region_error="eager", plugins=manager(plugin), progress="off"
    )

    ids = token_ids()
    torch.testing.assert_close(model(ids), twin(ids))
    by_path = {r.path: r for r in torchkiln.report(model).regions}
    assert by_path["layers.1"].status == "eager"
    assert "cannot compile group MlpBlock" in (by_path["layers.1"].fallback_reason or "")
    assert by_path["layers.0"].status == "compiled" and by_path["layers.0"].graphs == 1
    assert "forward" not in model.layers[1].__dict__


def test_a_users_own_error_is_raised_unchanged() -> None:
    """An exception from the model itself is not a compile failure: no fallback, same error."""
    model = NestedListModel().eval()
    torchkiln.compile(model, backend="eager", on_region_error="eager", progress="off")
    with pytest.raises(IndexError):
        model(torch.tensor([[10_000]]))  # out of the embedding's range, before any region
    bad = torch.randn(2, 3, 7)  # wrong width: the block's own LayerNorm raises
    with pytest.raises(RuntimeError):
        model.stages[0][0](bad)


def test_eager_policy_does_not_retry_a_failed_group_per_region() -> None:
    attempts: list[str] = []

    def counting_refusal(graph_module: torch.fx.GraphModule, example_inputs: Any) -> Any:
        attempts.append("compile")
        raise RuntimeError(BOOM)

    class CountingBroken(BrokenBackend):
        @torchkiln.hookimpl
        def compile_region(self, fn, group, backend):  # type: ignore[no-untyped-def]
            return torch.compile(fn, backend=counting_refusal) if backend == "broken" else None

    model = NestedListModel().eval()
    torchkiln.compile(
        model,
        backend="broken",
        on_region_error="eager",
        plugins=manager(CountingBroken()),
        progress="off",
    )
    model(token_ids())
    report = torchkiln.report(model)
    assert attempts == ["compile"]  # one failed compile for the group, not one per region
    assert [r.status for r in report.regions] == ["eager"] * 4
    assert [r.fallback_reason.startswith("not retried") for r in report.regions] == [
        False,
        True,
        True,
        True,
    ]
