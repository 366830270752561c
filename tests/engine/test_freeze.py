"""Serving mode (``torchkiln.freeze``): after the freeze Dynamo compiles no frame for the model;
a call no compiled form fits raises ``UncoveredCallError`` (naming the region and the guard)
or runs eagerly with one warning per group. Dynamo's own frame counter is the witness."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

import torchkiln
from torchkiln.engine.serving import UncoveredCallWarning
from torchkiln.examples import llama

pytestmark = pytest.mark.usefixtures("reset_dynamo")


def tiny() -> torch.nn.Module:
    return llama(
        depth=3, hidden_size=64, intermediate_size=128, heads=4, kv_heads=2, vocab_size=256
    )


def ids(batch: int, seq: int = 8) -> torch.Tensor:
    return torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(batch))


def frames() -> int:
    return sum(counters["frames"].values())


def warmed(backend: str = "eager") -> tuple[torch.nn.Module, torch.nn.Module]:
    model = tiny()
    reference = copy.deepcopy(model)
    torchkiln.compile(model, backend=backend, progress="off")
    with torch.no_grad():
        model(ids(1))
    return model, reference


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_a_frozen_model_serves_what_it_warmed_and_refuses_the_rest(backend: str) -> None:
    model, reference = warmed(backend)
    forwards = [layer.__dict__["forward"] for layer in model.model.layers]
    assert torchkiln.freeze(model) is model
    before = frames()
    with torch.no_grad():
        torch.testing.assert_close(model(ids(1)).logits, reference(ids(1)).logits)
        with pytest.raises(torchkiln.UncoveredCallError) as caught:
            model(ids(3))  # another batch size: no compiled form covers it
    assert frames() == before  # Dynamo compiled (and even tried) nothing after the freeze
    message = str(caught.value)
    assert "region 'model.layers.0' (group 'LlamaDecoderLayer')" in message
    assert caught.value.guards and "expected 1, actual 3" in caught.value.guards[0]
    assert [layer.__dict__["forward"] for layer in model.model.layers] == forwards
    report = str(torchkiln.report(model))
    assert (
        "frozen (on_miss='raise'): 1 region call no compiled form covered (LlamaDecoderLayer 1)"
        in report
    )


def test_on_miss_eager_runs_uncovered_calls_eagerly_with_one_warning_per_group() -> None:
    model, reference = warmed()
    torchkiln.freeze(model, on_miss="eager")
    before = frames()
    with pytest.warns(UncoveredCallWarning) as caught, torch.no_grad():
        for batch in (3, 3, 1, 2):
            torch.testing.assert_close(model(ids(batch)).logits, reference(ids(batch)).logits)
    assert frames() == before
    assert len(caught) == 1  # one group, one warning, whatever the number of calls
    assert "'LlamaDecoderLayer'" in str(caught[0].message)
    assert "ran eagerly" in str(caught[0].message)
    report = torchkiln.report(model)
    assert report.regions[0].eager_calls == 3  # the three calls of other batch sizes
    assert "frozen (on_miss='eager'): 9 region calls no compiled form covered" in str(report)


def test_a_region_never_called_before_the_freeze_is_uncovered() -> None:
    model = tiny()
    torchkiln.compile(model, backend="eager", progress="off")
    torchkiln.freeze(model)
    with pytest.raises(torchkiln.UncoveredCallError, match="had no call before the freeze"):
        model(ids(1))


def test_bad_input_is_refused_by_name() -> None:
    model, _ = warmed()
    with pytest.raises(
        torchkiln.ConfigError, match=r"freeze\(on_miss\).*allowed: 'raise', 'eager'"
    ):
        torchkiln.freeze(model, on_miss="compile")
    with pytest.raises(torchkiln.TorchkilnError, match="not compiled by torchkiln"):
        torchkiln.freeze(tiny())
