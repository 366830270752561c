"""Bad use gets a clear error, before anything is touched."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from engine_zoo import NestedListModel, token_ids
from torch import nn

import torchkiln


def untouched(model: nn.Module) -> bool:
    return not torchkiln.is_compiled(model) and not any(
        "forward" in m.__dict__ for m in model.modules()
    )


def test_compiling_twice_raises() -> None:
    model = torchkiln.compile(NestedListModel(), backend="eager", progress="off")
    with pytest.raises(torchkiln.TorchkilnError, match=r"already compiled.*torchkiln\.decompile"):
        torchkiln.compile(model, backend="eager", progress="off")
    model(token_ids())  # still the first compilation, working
    assert [r.status for r in torchkiln.report(model).regions] == ["compiled"] * 4


def test_a_torch_compiled_module_is_refused() -> None:
    optimized = torch.compile(NestedListModel(), backend="eager")
    with pytest.raises(torchkiln.DistributedError, match=r"already wrapped by torch\.compile"):
        torchkiln.compile(optimized, backend="eager")
    assert untouched(optimized._orig_mod)


@pytest.fixture
def single_process_group() -> object:
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")
def test_a_ddp_wrapped_module_is_refused(single_process_group: object) -> None:
    model = NestedListModel()
    wrapped = nn.parallel.DistributedDataParallel(model)
    with pytest.raises(torchkiln.DistributedError, match=r"DDP.*distributed='ddp'"):
        torchkiln.compile(wrapped, backend="eager")
    assert untouched(model)


def test_not_a_module() -> None:
    with pytest.raises(
        torchkiln.TorchkilnError, match=r"expects a torch\.nn\.Module, got function"
    ):
        torchkiln.compile(lambda x: x, backend="eager")


def test_report_on_an_uncompiled_model_raises() -> None:
    with pytest.raises(torchkiln.TorchkilnError, match="not compiled by torchkiln"):
        torchkiln.report(NestedListModel())


def test_report_after_decompile_raises() -> None:
    model = torchkiln.compile(NestedListModel(), backend="eager", progress="off")
    torchkiln.decompile(model)
    with pytest.raises(torchkiln.TorchkilnError, match="or was decompiled"):
        torchkiln.report(model)


def test_bad_backend_name() -> None:
    model = NestedListModel()
    with pytest.raises(torchkiln.ConfigError) as caught:
        torchkiln.compile(model, backend="inductr")
    [problem] = caught.value.problems
    assert problem.path == "$.backend"
    assert problem.source == "argument"
    assert "'inductr' is not a registered backend" in problem.message
    assert "did you mean 'inductor'?" in problem.message
    assert "aot_eager" in problem.message and "eager" in problem.message  # what is allowed
    assert untouched(model)


def test_every_bad_option_is_named_at_once() -> None:
    with pytest.raises(torchkiln.ConfigError) as caught:
        torchkiln.compile(
            NestedListModel(),
            backend="eager",
            mode="max-autotune",
            on_region_error="ignore",
            regions={"strategy": "biggest", "rest": "all"},
        )
    paths = {p.path for p in caught.value.problems}
    assert paths == {"$.mode", "$.on_region_error", "$.regions.strategy", "$.regions.rest"}
    text = str(caught.value)
    assert "allowed: eager, raise" in text  # on_region_error's choices


def test_unknown_option() -> None:
    with pytest.raises(torchkiln.ConfigError, match=r"\$\.backnd.*did you mean 'backend'"):
        torchkiln.compile(NestedListModel(), backnd="eager")


@pytest.mark.parametrize("options", [{"backend": "no"}, {"backend": "eager", "disable": True}])
def test_compilation_off_leaves_the_model_alone(options: dict[str, object]) -> None:
    model = NestedListModel().eval()
    twin = copy.deepcopy(model)
    assert torchkiln.compile(model, **options) is model
    assert untouched(model)
    torch.testing.assert_close(model(token_ids()), twin(token_ids()))
