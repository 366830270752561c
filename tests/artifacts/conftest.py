"""Fixtures for the compiled-artifact tests (torchkiln.artifacts: cache, precompile): a clean
Dynamo, a clean environment, one precompiled directory per module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch._dynamo
from precompile_models import inputs, stack

import torchkiln


@pytest.fixture(autouse=True)
def fresh_dynamo(reset_dynamo: None) -> None:
    """Every test starts with no compiled code and zeroed counters, so graph counts are its own."""


@pytest.fixture(autouse=True)
def clean_environment(torchkiln_clean_environment: None) -> None:
    """No TORCHKILN_* / ACCELERATE_* variable or ./torchkiln.yaml reaches a test."""


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory with both kinds for the 3-block stack (aot_eager), shared by a module's
    tests (the precompile tests)."""
    directory = tmp_path_factory.mktemp("artifacts")
    result = torchkiln.precompile(stack(), inputs(), directory, backend="aot_eager")
    assert result.skipped == [], result.summary()
    torch._dynamo.reset()
    return directory
