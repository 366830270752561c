""":mod:`torchkiln.engine.saved_guards`: a group function compiled to be saved drops the guards
torch cannot save on a class the key covers (an attention processor's), and keeps the guard on
the processor's type, so another processor class does not fit the saved function.

Compiles a tiny module shaped like diffusers' attention (it calls an object it holds and reads
that object's signature) with the ``eager`` backend and saves it with torch's ``aot_compile``.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from torchkiln._internals.aot_artifacts import loaded_guard_table
from torchkiln.configuration.config import CompileConfig
from torchkiln.engine.saved_guards import ON_A_CLASS, TORCH_DEFAULT, SavedGuardFilter, saving_config


class Processor:
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class OtherProcessor(Processor):
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3


class Attention(nn.Module):
    def __init__(self, processor: Processor) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.processor = processor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert "x" in inspect.signature(self.processor.__call__).parameters
        return self.processor(self.linear(x))


def group_function(module: nn.Module, /, *args, **kwargs):
    return type(module).forward(module, *args, **kwargs)


def _saved(tmp_path: Path, options: dict) -> Path:
    torch._dynamo.reset()
    compiled = torch.compile(group_function, backend="eager", fullgraph=True, options=options)
    aot = compiled.aot_compile(((Attention(Processor()), torch.randn(2, 4)), {}))
    path = tmp_path / "entry.bin"
    aot.save_compiled_function(str(path))
    return path


@pytest.mark.needs_feature("precompiled artifacts")
def test_torchs_default_cannot_save_a_module_that_reads_its_processors_signature(tmp_path):
    with pytest.raises(Exception, match="ID_MATCH guard cannot be serialized"):
        _saved(tmp_path, {})


@pytest.mark.needs_feature("precompiled artifacts")
def test_the_filter_saves_it_and_the_processors_type_still_decides(tmp_path):
    kept = SavedGuardFilter()
    path = _saved(tmp_path, {"guard_filter_fn": kept})
    assert kept.dropped[ON_A_CLASS] >= 1 and kept.dropped[TORCH_DEFAULT] >= 1, kept.dropped
    with path.open("rb") as file:
        loaded = torch.compiler.load_compiled_function(file)
    table = loaded_guard_table([loaded])
    x = torch.randn(2, 4)
    same = Attention(Processor())
    function = table.find({"module": same, "args": (x,), "kwargs": {}})
    assert function is not None
    torch.testing.assert_close(function(same, x), same(x))
    other = {"module": Attention(OtherProcessor()), "args": (x,), "kwargs": {}}
    assert table.find(other) is None
    (failed,) = table.first_failures(other)
    assert "processor" in failed, failed


def test_a_users_guard_filter_decides_too_and_stands_in_for_torchs_default() -> None:
    tensor = SimpleNamespace(
        guard_type="TENSOR_MATCH", derived_guard_types=(), is_global=False, name="x"
    )
    a_global = SimpleNamespace(
        guard_type="ID_MATCH", derived_guard_types=("ID_MATCH",), is_global=True, name="G['f']"
    )
    verdicts = {"none": [False, False], "all": [True, True]}
    for users, expected in verdicts.items():
        options = {"guard_filter_fn": lambda entries, users=users: [users == "all"] * len(entries)}
        config = saving_config(CompileConfig(backend="eager", options=options))
        assert config.fullgraph is True
        assert config.options["guard_filter_fn"]([tensor, a_global]) == expected
    # Without one, torch's default drops the global.
    assert SavedGuardFilter()([tensor, a_global]) == [True, False]


def test_an_inductor_mode_becomes_its_options_beside_the_filter() -> None:
    config = saving_config(CompileConfig(backend="inductor", mode="max-autotune-no-cudagraphs"))
    assert config.mode is None
    assert config.options["max_autotune"] is True
    assert isinstance(config.options["guard_filter_fn"], SavedGuardFilter)
    other = saving_config(CompileConfig(backend="aot_eager", mode="reduce-overhead"), dynamic=True)
    assert other.mode == "reduce-overhead" and "guard_filter_fn" not in other.options
    assert other.dynamic is True and other.fullgraph is True
