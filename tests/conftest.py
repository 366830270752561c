"""Fixtures shared by every test folder: an isolated plugin manager, a clean Dynamo, a small
model. Folder conftests make the ones they need autouse."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
from stack_model import Stack
from torch._dynamo.utils import counters

import torchkiln


@pytest.fixture
def pm(torchkiln_plugin_manager: torchkiln.PluginManager) -> torchkiln.PluginManager:
    """An isolated manager: the built-in plugins, no entry points, no environment controls."""
    return torchkiln_plugin_manager


@pytest.fixture
def stack() -> Stack:
    return Stack()


def reset_dynamo_state() -> None:
    """No compiled code and zeroed counters (``torch._dynamo.reset()`` keeps the counters)."""
    torch._dynamo.reset()
    counters.clear()


@pytest.fixture
def reset_dynamo() -> Iterator[None]:
    """A test starts with no compiled code and zeroed counters, so graph counts are its own."""
    reset_dynamo_state()
    yield
    reset_dynamo_state()
