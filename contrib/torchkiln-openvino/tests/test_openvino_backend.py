"""torchkiln-openvino, installed: found through its entry point, and compiling a small
transformer region by region with real OpenVINO on the CPU, equal to eager in f32."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torchkiln_openvino
from torch import nn

import torchkiln
from torchkiln.testing import assert_backend_matches_eager

F32 = {"device": "CPU", "config": {"INFERENCE_PRECISION_HINT": "f32"}}


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and an MLP."""

    def __init__(self, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = (
            self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, width // self.heads).unbind(2)
        )
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.out(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, depth: int = 4, width: int = 64, vocab: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


@pytest.fixture
def openvino_graphs(monkeypatch):
    """Graphs OpenVINO really compiled. (Its backend runs in torch, without a word, any graph it
    cannot convert; counting is how the test knows OpenVINO did the work.)"""
    from openvino.frontend.pytorch.torchdynamo import execute

    compiled: list[int] = []
    real = execute.openvino_compile

    def counting(graph, *args, **kwargs):
        compiled.append(len(graph.graph.nodes))
        return real(graph, *args, **kwargs)

    monkeypatch.setattr(execute, "openvino_compile", counting)
    return compiled


def test_plugin_is_installed_and_found_through_its_entry_point():
    site_packages = Path(sysconfig.get_paths()["purelib"])
    assert Path(torchkiln_openvino.__file__).is_relative_to(site_packages)
    declared = torchkiln.PluginManager().backends()["openvino"]
    assert declared.plugin == "openvino"  # the entry-point name
    assert declared.spec.origin == "plugin"
    assert declared.spec.training is False
    assert declared.spec.probe().available


def test_small_transformer_compiles_regionally_and_matches_eager(openvino_graphs):
    torch.manual_seed(0)
    model = TinyTransformer(depth=4).eval()
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids)
        torchkiln.compile(model, backend="openvino", options=F32)
        actual = model(ids)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    report = torchkiln.report(model)
    assert [r.path for r in report.regions] == [f"blocks.{i}" for i in range(4)]
    assert {r.status for r in report.regions} <= {"compiled", "compiled (reused)"}
    assert report.total_graphs >= 1
    assert openvino_graphs, "OpenVINO compiled nothing: every graph ran in torch"
    # One group: OpenVINO compiled the block's graph once, not once per block.
    assert len(openvino_graphs) < 4
    # The weights are graph inputs, not constants baked into the compiled block.
    with torch.no_grad():
        for parameter in model.blocks.parameters():
            parameter.mul_(1.1)
        reference = TinyTransformer(depth=4).eval()
        reference.load_state_dict(model.state_dict())
        torch.testing.assert_close(model(ids), reference(ids), rtol=1e-4, atol=1e-5)


def test_assert_backend_matches_eager_with_openvino(openvino_graphs):
    check = assert_backend_matches_eager("openvino", options=F32, rtol=1e-4, atol=1e-5)
    assert check.graphs >= 1
    assert check.gradients_checked == 0  # inference only
    assert openvino_graphs


def test_bad_options_and_modes_are_refused_with_what_is_allowed():
    with pytest.raises(torchkiln.ConfigError) as raised:
        torchkiln.compile(TinyTransformer(), backend="openvino", options={"devcie": "CPU"})
    message = str(raised.value)
    assert "does not accept option 'devcie'" in message
    assert "device, config, model_caching" in message
    with pytest.raises(torchkiln.ConfigError, match="leave mode unset"):
        torchkiln.compile(TinyTransformer(), backend="openvino", mode="max-autotune")


def test_listing_and_compiling_leave_torch_dynamo_config_alone():
    """Importing openvino.torch turns inline_inbuilt_nn_modules off process-wide; the plugin
    keeps torch's value (a fresh process, so nothing else imported openvino first)."""
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "import torch, torchkiln\n"
        "before = torch._dynamo.config.inline_inbuilt_nn_modules\n"
        "torchkiln.PluginManager().backends()['openvino'].spec.probe()\n"
        "model = torch.nn.Sequential(torch.nn.Linear(4, 4))\n"
        "torchkiln.compile(model, backend='openvino', regions='whole')\n"
        "with torch.no_grad(): model(torch.randn(2, 4))\n"
        "print(before, torch._dynamo.config.inline_inbuilt_nn_modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["True", "True"]
