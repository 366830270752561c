"""Fixtures shared by every test folder: an isolated plugin manager, a clean Dynamo, a small
model. Folder conftests make the ones they need autouse."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch._dynamo
from stack_model import Stack
from torch._dynamo.utils import counters
from zoo_imports import harmless_torchvision

import torchkiln

harmless_torchvision()  # before any test imports transformers (docs/zoo.md)


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


@pytest.fixture(scope="session")
def launching() -> ModuleType:
    """The suite's launcher helpers (``tests/distributed/launching.py``) for tests outside that
    folder, where it is not on ``sys.path``."""
    path = Path(__file__).parent / "distributed" / "launching.py"
    spec = importlib.util.spec_from_file_location("torchkiln_tests_launching", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def no_setting_left_deleted() -> Iterator[None]:
    """Fail the test that deletes a Dynamo or inductor setting (undoing ``monkeypatch.setattr``
    on ``config.cpp`` does that), not the unrelated compile that next reads it."""
    yield
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    deleted = []
    for module in (dynamo_config, inductor_config):
        for name, entry in module._config.items():
            if entry.hide:
                deleted.append(f"{module.__name__}.{name}")
                entry.hide = False  # back to its default, so that later tests are unaffected
    assert not deleted, f"this test left settings deleted: {deleted}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.needs_feature(name)``: skipped on a torch that lacks the feature, with the
    reason ``compile`` gives when it refuses it (tests/internals/test_versions.py checks that
    refusal on every torch)."""
    from torchkiln._internals.versions import feature_problem

    for item in items:
        for marker in item.iter_markers("needs_feature"):
            problem = feature_problem(marker.args[0])
            if problem is not None:
                item.add_marker(pytest.mark.skip(reason=problem))
