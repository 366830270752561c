"""Contracts of ``torchkiln._internals.diffusers``: each adapter function works on the installed
diffusers (and this torch)."""

from __future__ import annotations

import pytest
from torch import nn

from torchkiln._internals.diffusers import repeated_blocks


def test_repeated_blocks() -> None:
    flux = pytest.importorskip("diffusers.models.transformers.transformer_flux")
    assert list(repeated_blocks(flux.FluxTransformer2DModel)) == [
        "FluxTransformerBlock",
        "FluxSingleTransformerBlock",
    ]
    assert repeated_blocks(nn.Linear(2, 2)) is None
