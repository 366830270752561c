"""The drop-in functions of ``torchkiln.compat.accelerate`` on GPT-2 and Llama built from
configs: Accelerate's documented expectations, met in place."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from accelerate_helpers import compiled_graphs, gpt2_model, llama_model, logits, token_ids
from torch import nn

import torchkiln
from torchkiln.compat.accelerate import (
    DynamoBackend,
    TorchDynamoPlugin,
    compile_regions,
    compile_regions_deepspeed,
    compile_regions_fsdp2,
    extract_model_from_parallel,
    has_compiled_regions,
    is_compiled_module,
    torchkiln_options,
)
from torchkiln.errors import ConfigError

GPT2_REGIONS = [
    "transformer.h.0",
    "transformer.h.1",
    "transformer.wte",
    "transformer.wpe",
    "transformer.ln_f",
    "lm_head",
]
LLAMA_REGIONS = ["model.layers.0", "model.layers.1", "model.embed_tokens", "model.norm", "lm_head"]


def region_paths(model: nn.Module) -> list[str]:
    return [region["path"] for region in torchkiln.report(model).to_dict()["regions"]]


def compiled_region_paths(model: nn.Module) -> list[str]:
    return [
        r["path"]
        for r in torchkiln.report(model).to_dict()["regions"]
        if r["status"].startswith("compiled")
    ]


@pytest.mark.parametrize(
    ("build", "blocks", "expected", "block_class"),
    [
        (gpt2_model, "transformer.h", GPT2_REGIONS, "GPT2Block"),
        (llama_model, "model.layers", LLAMA_REGIONS, "LlamaDecoderLayer"),
    ],
    ids=["gpt2", "llama"],
)
def test_compile_regions_meets_accelerates_expectations(
    build, blocks, expected, block_class
) -> None:
    model = build()
    ids = token_ids()
    eager = logits(model, ids)
    keys_before = list(model.state_dict())

    compiled = compile_regions(model, backend="aot_eager")

    assert compiled is model  # in place
    assert compiled._orig_mod is model  # Accelerate's contract: the original is reachable
    block = compiled.get_submodule(blocks)[0]  # still indexable
    assert type(block).__name__ == block_class
    assert is_compiled_module(block) and is_compiled_module(compiled.lm_head)
    assert not is_compiled_module(compiled)  # regional, as in Accelerate
    assert has_compiled_regions(compiled)
    assert list(compiled.state_dict()) == keys_before  # no _orig_mod. anywhere
    assert "_orig_mod" not in dict(compiled.named_children())
    assert not any("_orig_mod" in path for path, _ in compiled.named_modules())

    torch.testing.assert_close(logits(compiled, ids), eager)
    assert compiled_region_paths(compiled) == expected
    # The two blocks share one compiled graph; each leaf outside them is its own.
    report = {r["path"]: r for r in torchkiln.report(compiled).to_dict()["regions"]}
    assert report[f"{blocks}.0"]["graphs"] == 1 and report[f"{blocks}.1"]["graphs"] == 0


@pytest.mark.parametrize("variant", [compile_regions_deepspeed, compile_regions_fsdp2])
def test_deepspeed_and_fsdp2_variants_keep_block_classes(variant) -> None:
    model = llama_model()
    layers = list(model.model.layers)
    ids = token_ids()
    eager = logits(model, ids)

    returned = variant(model, backend="aot_eager")

    assert returned is model
    assert [type(layer) for layer in model.model.layers] == [type(layer) for layer in layers]
    assert all(a is b for a, b in zip(model.model.layers, layers))
    assert isinstance(model.lm_head, nn.Linear)  # an nn built-in, and compiled for real:
    torch.testing.assert_close(logits(model, ids), eager)
    assert compiled_region_paths(model) == LLAMA_REGIONS
    assert compiled_graphs() >= 4  # one block graph + embed_tokens, norm, lm_head


def test_forward_hooks_added_after_compile_still_fire() -> None:
    """What FSDP2 relies on: fully_shard registers hooks after Accelerate's compile."""
    model = llama_model()
    compile_regions_fsdp2(model, backend="eager")
    calls: list[str] = []
    for index, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(lambda *_, i=index: calls.append(f"layer{i}"))
    logits(model, token_ids())
    assert calls == ["layer0", "layer1"]
    assert compiled_graphs() >= 1


def test_decompile_undoes_compile_regions() -> None:
    model = compile_regions(gpt2_model(), backend="eager")
    torchkiln.decompile(model)
    assert "_orig_mod" not in model.__dict__
    assert not has_compiled_regions(model) and not is_compiled_module(model.transformer.h[0])


def test_regions_of_a_model_compiled_by_torchkiln_directly_count_as_compiled() -> None:
    model = torchkiln.compile(gpt2_model(), backend="eager")
    block = model.transformer.h[1]
    assert is_compiled_module(block)  # before the first call (first-call shim) ...
    logits(model, token_ids())
    assert is_compiled_module(block)  # ... and after
    assert not is_compiled_module(model.lm_head)  # torchkiln's default: regions.rest=eager
    assert not is_compiled_module(model.transformer)
    torchkiln.decompile(model)
    assert not is_compiled_module(block) and not has_compiled_regions(model)


def test_blocks_in_sequential_and_moduledict_are_found() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stack = nn.Sequential(Block(), Block())
            self.named = nn.ModuleDict({"a": Block(), "b": Block()})
            self.head = nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.stack(x)
            for block in self.named.values():
                x = block(x)
            return self.head(x)

    torch.manual_seed(0)
    model = Model()
    x = torch.randn(3, 8)
    eager = model(x)
    compile_regions(model, backend="eager")
    torch.testing.assert_close(model(x), eager)
    assert compiled_region_paths(model) == ["stack.0", "stack.1", "named.a", "named.b", "head"]
    assert isinstance(model.stack, nn.Sequential) and model.stack[0] is model.stack._modules["0"]


# --- unwrap ---------------------------------------------------------------------------------


def test_unwrap_keeping_compile_is_the_compiled_model() -> None:
    model = compile_regions(gpt2_model(), backend="eager")
    assert extract_model_from_parallel(model) is model
    assert extract_model_from_parallel(model, keep_torch_compile=True) is model


def test_unwrap_without_compile_is_the_model_itself_and_its_hooks_fire_compiled() -> None:
    """The Trainer's ``unwrap_model(model, keep_torch_compile=False) is not model`` and a hook
    registered on the unwrapped module: identity holds, and the hook fires in the compiled
    run; ``set_stance("force_eager")`` runs it eagerly."""
    model = compile_regions(gpt2_model(), backend="eager")
    ids = token_ids()
    expected = logits(model, ids)
    graphs = compiled_graphs()

    plain = extract_model_from_parallel(model, keep_torch_compile=False)

    assert plain is model and extract_model_from_parallel(model, keep_torch_compile=False) is plain
    seen: list[tuple[int, ...]] = []

    def record(module: nn.Module, args: object, output: object) -> None:
        hidden = output[0] if isinstance(output, tuple) else output
        seen.append(tuple(hidden.shape[:2]))

    handle = plain.transformer.h[0].register_forward_hook(record)
    torch.testing.assert_close(logits(plain, ids), expected)
    assert seen == [tuple(ids.shape)] and compiled_graphs() == graphs  # compiled, no retrace
    assert is_compiled_module(model.transformer.h[0]) and model._orig_mod is model
    assert compiled_region_paths(model) == GPT2_REGIONS
    with torch.compiler.set_stance("force_eager"):
        torch.testing.assert_close(logits(plain, ids), expected)
    assert len(seen) == 2
    handle.remove()


def test_unwrap_reaches_through_data_parallel() -> None:
    model = compile_regions(llama_model(), backend="eager")
    wrapped = nn.DataParallel(model)
    assert extract_model_from_parallel(wrapped) is model
    assert extract_model_from_parallel(wrapped, keep_torch_compile=False) is model
    assert wrapped.module is model and has_compiled_regions(model)


def test_unwrap_of_a_torch_compile_wrapper() -> None:
    model = llama_model()
    wrapper = torch.compile(model, backend="eager")
    assert extract_model_from_parallel(wrapper) is wrapper
    assert extract_model_from_parallel(wrapper, keep_torch_compile=False) is model
    assert is_compiled_module(wrapper) and has_compiled_regions(wrapper)


def test_recursive_unwrap_is_refused_with_the_reason() -> None:
    with pytest.raises(NotImplementedError, match="never wraps sub-layers"):
        extract_model_from_parallel(gpt2_model(), recursive=True)


# --- arguments ------------------------------------------------------------------------------


def test_compile_regions_means_the_same_whatever_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHKILN_BACKEND", "no")
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "NO")
    monkeypatch.setenv("TORCHKILN_REGIONS_STRATEGY", "whole")
    model = compile_regions(gpt2_model(), backend="eager")
    assert compiled_region_paths(model) == []  # nothing ran yet: pending
    assert region_paths(model) == GPT2_REGIONS


def test_options_are_torch_compiles_defaults_plus_accelerates_regions() -> None:
    assert torchkiln_options({}) == {
        "backend": "inductor",
        "mode": None,
        "fullgraph": False,
        "dynamic": None,
        "options": {},
        "disable": False,
        "regions": {"strategy": "auto", "rest": "leaves"},
        "distributed": "none",
    }
    options = torchkiln_options({"backend": DynamoBackend.TORCHXLA_TRACE_ONCE, "mode": "default"})
    assert (options["backend"], options["mode"]) == ("xla_inference", None)
    assert torchkiln_options({"backend": "FX2TRT"})["backend"] == "tensorrt"
    assert torchkiln_options({"backend": "openvino"})["backend"] == "openvino"
    assert torchkiln_options({"regions": "whole"})["regions"] == "whole"


def test_bad_arguments_are_named() -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) fullgrpah; allowed"):
        compile_regions(gpt2_model(), fullgrpah=True)
    with pytest.raises(TypeError, match="backend must be a name, not function"):
        compile_regions(gpt2_model(), backend=lambda gm, inputs: gm)
    with pytest.raises(ConfigError, match="'OFI' has no torchkiln backend"):
        compile_regions(gpt2_model(), backend=DynamoBackend.OFI)


# --- TorchDynamoPlugin ----------------------------------------------------------------------


def test_plugin_defaults_without_environment() -> None:
    plugin = TorchDynamoPlugin()
    assert plugin.to_dict() == {
        "backend": "no",
        "mode": "default",
        "fullgraph": False,
        "dynamic": None,
        "options": None,
        "disable": False,
        "use_regional_compilation": False,
    }
    assert plugin.backend is DynamoBackend.NO
    assert plugin.to_kwargs() == {}


def test_plugin_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "aot_eager")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "max-autotune")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "true")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "false")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "1")
    plugin = TorchDynamoPlugin()
    assert plugin.backend is DynamoBackend.AOT_EAGER
    assert (plugin.mode, plugin.fullgraph, plugin.use_regional_compilation) == (
        "max-autotune",
        True,
        True,
    )
    assert plugin.dynamic is None  # launcher's default False is not a choice
    assert plugin.to_kwargs() == {"backend": "aot_eager", "mode": "max-autotune", "fullgraph": True}
    # Arguments win over the environment, as in Accelerate.
    assert TorchDynamoPlugin(backend="eager", dynamic=False).to_kwargs()["dynamic"] is False
    assert TorchDynamoPlugin(backend="eager").backend is DynamoBackend.EAGER


def test_plugin_to_torchkiln_compiles_the_same_way() -> None:
    plugin = TorchDynamoPlugin(backend="AOT_EAGER", use_regional_compilation=True)
    assert plugin.to_torchkiln() == {
        "backend": "aot_eager",
        "mode": None,
        "fullgraph": False,
        "dynamic": None,
        "options": {},
        "disable": False,
        "regions": {"strategy": "auto", "rest": "leaves"},
    }
    model = torchkiln.compile(gpt2_model(), **plugin.to_torchkiln())
    assert region_paths(model) == GPT2_REGIONS
    whole = TorchDynamoPlugin(backend="eager").to_torchkiln()
    assert whole["regions"] == {"strategy": "whole"}


def test_plugin_is_a_dataclass_like_accelerates() -> None:
    plugin = dataclasses.replace(TorchDynamoPlugin(backend="eager"), fullgraph=True)
    assert plugin.fullgraph is True and plugin.backend is DynamoBackend.EAGER
    assert [f.name for f in dataclasses.fields(plugin)] == [
        "backend",
        "mode",
        "fullgraph",
        "dynamic",
        "options",
        "disable",
        "use_regional_compilation",
    ]


def test_plugin_rejects_unknown_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"\(from argument\): 'warp' is not an Accelerate dynamo"):
        TorchDynamoPlugin(backend="warp")
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "warp")
    with pytest.raises(ValueError, match=r"\(from env:ACCELERATE_DYNAMO_BACKEND\): 'warp'"):
        TorchDynamoPlugin()
