"""Families users bring, checked as a held-out trial would: graphs, eager regions, exactness,
and the report against the profiler (tests/profiler_witness.py).

CI runs a representative sample (``slow``); the whole zoo is ``tox -e zoo`` (marker ``zoo``),
run by hand: docs/zoo.md has its measured result.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from profiler_witness import assert_report_agrees, profiled_block_calls
from torch._dynamo.utils import counters
from zoo_imports import import_timm

import torchkiln

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()
    counters.clear()


def graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def mamba(depth: int) -> torch.nn.Module:
    config = transformers.MambaConfig(
        hidden_size=64, state_size=8, num_hidden_layers=depth, vocab_size=128
    )
    torch.manual_seed(0)
    return transformers.MambaForCausalLM(config).eval()


def check_mamba_generate(depth: int) -> torchkiln.CompileReport:
    model = mamba(depth)
    ids = torch.randint(0, 128, (1, 5))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=6, do_sample=False)
    torchkiln.compile(model, backend="eager", progress="off")
    out: list[torch.Tensor] = []

    def run() -> None:
        with torch.no_grad():
            out.append(model.generate(ids, max_new_tokens=6, do_sample=False))

    seen = profiled_block_calls(model.backbone.layers, run)
    assert torch.equal(out[0], expected)
    assert all(s.calls == 6 for s in seen)
    report = torchkiln.report(model)
    assert_report_agrees(report, model.backbone.layers, seen)
    return report


@pytest.mark.slow
def test_mamba_generate_report_agrees_with_the_profiler() -> None:
    """CI's sample: 4 layers under a recompile limit of 2, so that per-layer cache guards (if
    any) hit the limit as 12 layers do under the default limit of 8, at a third of the cost."""
    with torch._dynamo.config.patch(recompile_limit=2):
        check_mamba_generate(4)


@pytest.mark.zoo
def test_mamba_generate_at_depth_12_report_agrees_with_the_profiler() -> None:
    check_mamba_generate(12)


def peft_llama(adapters: int) -> torch.nn.Module:
    peft = pytest.importorskip("peft")
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128,
    )  # fmt: skip
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(config).eval()
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(base, lora, adapter_name="a0")
    for index in range(1, adapters):
        model.add_adapter(f"a{index}", lora)
    return model


@pytest.mark.slow
def test_peft_with_four_adapters_report_agrees_with_the_profiler() -> None:
    model = peft_llama(4)
    ids = torch.randint(0, 128, (1, 6))
    expected = {}
    with torch.no_grad():
        for index in range(4):
            model.set_adapter(f"a{index}")
            expected[index] = model(ids).logits
    torchkiln.compile(model, backend="eager", progress="off")
    layers = model.base_model.model.model.layers

    def run() -> None:
        with torch.no_grad():
            for _ in range(2):
                for index in range(4):
                    model.set_adapter(f"a{index}")
                    torch.testing.assert_close(model(ids).logits, expected[index])
                with model.disable_adapter():
                    model(ids)

    seen = profiled_block_calls(layers, run)
    assert torch.is_grad_enabled()
    assert_report_agrees(torchkiln.report(model), layers, seen)


@pytest.mark.zoo  # timm needs torchvision, kept out of CI's envs (docs/zoo.md)
def test_efficientnet_b0_default_plan_compiles_at_most_four_graphs() -> None:
    timm = import_timm()
    torch.manual_seed(0)
    model = timm.create_model("efficientnet_b0", pretrained=False).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
    plan = torchkiln.plan(model)
    assert len(plan.groups) <= 4, plan.reason
    reasons = {part.path: part.reason for part in plan.eager}
    assert "bool attribute has_skip" in reasons["blocks.1.0"]
    torchkiln.compile(model, backend="eager", progress="off")
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected)
    assert graphs() <= 4
    assert all(r.status == "compiled" for r in torchkiln.report(model).regions)


def unet() -> torch.nn.Module:
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    return diffusers.UNet2DConditionModel(
        block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), layers_per_block=1,
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8, sample_size=16,
    ).eval()  # fmt: skip


@pytest.mark.zoo
def test_unet_default_plan_compiles_every_transformer_block_the_mid_block_one_included() -> None:
    model = unet()
    plan = torchkiln.plan(model)
    paths = {r.path for g in plan.groups for r in g.regions}
    transformer_blocks = {
        path for path, m in model.named_modules() if type(m).__name__ == "BasicTransformerBlock"
    }
    assert paths == transformer_blocks
    assert any(p.startswith("mid_block.") for p in paths)
    inputs = (torch.randn(1, 4, 16, 16), torch.tensor([3]), torch.randn(1, 5, 32))
    with torch.no_grad():
        expected = model(*inputs).sample
        torchkiln.compile(model, backend="eager", progress="off")
        torch.testing.assert_close(model(*inputs).sample, expected)
    assert graphs() == 2  # one per shape, as diffusers' compile_repeated_blocks
    assert all(r.status == "compiled" for r in torchkiln.report(model).regions)


@pytest.mark.zoo
def test_sd3_last_joint_block_left_out_says_why() -> None:
    diffusers = pytest.importorskip("diffusers")
    model = diffusers.SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=4, num_layers=4, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16,
        pooled_projection_dim=16, out_channels=4, pos_embed_max_size=32,
    )  # fmt: skip
    plan = torchkiln.plan(model)
    last = [p for p in plan.eager if p.path.startswith("transformer_blocks.3")]
    assert last
    assert all("a shape of its own" in p.reason for p in last)


@pytest.mark.zoo
def test_convnext_compiles_exactly_with_graphs_independent_of_depth() -> None:
    timm = import_timm()
    found = []
    for depths in ((2, 2, 3, 2), (2, 2, 5, 2)):
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = timm.create_model(
            "convnext_atto", pretrained=False, depths=depths, dims=(16, 32, 64, 128)
        ).eval()
        x = torch.randn(1, 3, 64, 64)
        with torch.no_grad():
            expected = model(x)
            torchkiln.compile(model, backend="eager", progress="off")
            torch.testing.assert_close(model(x), expected)
        assert all(r.status == "compiled" for r in torchkiln.report(model).regions)
        found.append(graphs())
    assert found[0] == found[1]


@pytest.mark.zoo
@pytest.mark.parametrize("family", ["falcon_mamba", "gpt_neo"])
def test_state_space_and_gpt_neo_generate_report_agrees(family: str) -> None:
    if family == "falcon_mamba":
        config = transformers.FalconMambaConfig(
            hidden_size=64, state_size=8, num_hidden_layers=12, vocab_size=128
        )
        model = transformers.FalconMambaForCausalLM(config).eval()
        layers = model.backbone.layers
    else:
        config = transformers.GPTNeoConfig(
            hidden_size=64, num_layers=12, num_heads=4, vocab_size=128,
            attention_types=[[["global", "local"], 6]], max_position_embeddings=64,
        )  # fmt: skip
        model = transformers.GPTNeoForCausalLM(config).eval()
        layers = model.transformer.h
    ids = torch.randint(0, 128, (1, 5))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=4, do_sample=False)
    torchkiln.compile(model, backend="eager", progress="off")
    out: list[torch.Tensor] = []

    def run() -> None:
        with torch.no_grad():
            out.append(model.generate(ids, max_new_tokens=4, do_sample=False))

    seen = profiled_block_calls(layers, run)
    assert torch.equal(out[0], expected)
    assert_report_agrees(torchkiln.report(model), layers, seen)
