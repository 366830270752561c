"""Fixtures for the planning tests: a clean Dynamo and a clean environment per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch._dynamo
from torch._dynamo.utils import counters

import torchkiln


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Every test starts with no compiled code and zeroed counters, so graph counts are its own."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def clean_environment(torchkiln_clean_environment: None) -> None:
    """No TORCHKILN_* variable or ./torchkiln.yaml reaches a test."""


@pytest.fixture
def pm(torchkiln_plugin_manager: torchkiln.PluginManager) -> torchkiln.PluginManager:
    """An isolated manager: the built-in plugins, no entry points, no environment controls."""
    return torchkiln_plugin_manager
