"""Fixtures for the engine tests: a clean Dynamo, a clean environment, the model matrix."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo
from engine_zoo import CASES, ModelCase
from torch._dynamo.utils import counters

import torchkiln
from torchkiln.plugin_manager import reset_plugin_manager


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Every test starts with no compiled code and zeroed counters, so graph counts are its own."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No TORCHKILN_* / ACCELERATE_* variable or ./torchkiln.yaml reaches a test."""
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


@pytest.fixture(params=CASES, ids=lambda case: case.name)
def case(request: pytest.FixtureRequest) -> ModelCase:
    return request.param
