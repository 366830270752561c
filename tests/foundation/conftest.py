"""Shared fixtures for the foundation tests: plugin manager, hooks, configuration."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from foundation_models import Stack

import torchkiln
from torchkiln.plugin_manager import reset_plugin_manager


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No TORCHKILN_* / ACCELERATE_* variable and no ./torchkiln.yaml leaks into a test, and the
    process-wide plugin manager is rebuilt for it (it reads the environment when created)."""
    for name in list(os.environ):
        if name.startswith(("TORCHKILN_", "ACCELERATE_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    reset_plugin_manager()
    yield
    reset_plugin_manager()


@pytest.fixture
def pm() -> torchkiln.PluginManager:
    """An isolated manager: the built-in plugins, no entry points, no environment controls."""
    return torchkiln.PluginManager(entry_points=False, env={})


@pytest.fixture
def stack() -> Stack:
    return Stack()


@pytest.fixture
def reset_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
