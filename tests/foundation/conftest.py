"""Shared fixtures for the foundation tests: plugin manager, hooks, configuration."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from foundation_models import Stack

import torchkiln


@pytest.fixture(autouse=True)
def clean_environment(torchkiln_clean_environment: None) -> None:
    """No TORCHKILN_* / ACCELERATE_* variable or ./torchkiln.yaml reaches a test."""


@pytest.fixture
def pm(torchkiln_plugin_manager: torchkiln.PluginManager) -> torchkiln.PluginManager:
    """An isolated manager: the built-in plugins, no entry points, no environment controls."""
    return torchkiln_plugin_manager


@pytest.fixture
def stack() -> Stack:
    return Stack()


@pytest.fixture
def reset_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
