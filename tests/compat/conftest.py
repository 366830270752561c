"""Shared fixtures for the Accelerate compatibility tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reset_dynamo: None) -> None:
    """No ACCELERATE_* / TORCHKILN_* variable, no torchkiln.yaml, no real HF cache; fresh
    Dynamo caches and counters (the root conftest's ``reset_dynamo``), so graph counts belong
    to the test that reads them."""
    for name in list(os.environ):
        if name.startswith(("ACCELERATE_", "TORCHKILN_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def fresh_accelerate() -> Iterator[None]:
    """Accelerate keeps one process-wide ``AcceleratorState`` (the first ``Accelerator``'s
    dynamo plugin wins): reset it so each test's ``Accelerator`` is built from its settings."""
    state = pytest.importorskip("accelerate.state")
    state.AcceleratorState._reset_state(reset_partial_state=True)
    yield
    state.AcceleratorState._reset_state(reset_partial_state=True)
