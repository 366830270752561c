"""Fresh Dynamo caches and counters, no TORCHKILN_* / ACCELERATE_* variables, a scratch
directory, for the training-framework integration tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reset_dynamo: None) -> None:
    """Dynamo is reset by the root conftest's ``reset_dynamo``."""
    for name in list(os.environ):
        if name.startswith(("ACCELERATE_", "TORCHKILN_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def fresh_accelerate() -> Iterator[None]:
    """A fresh process-wide ``AcceleratorState`` (the first ``Accelerator``'s settings stick)."""
    state = pytest.importorskip("accelerate.state")
    state.AcceleratorState._reset_state(reset_partial_state=True)
    yield
    state.AcceleratorState._reset_state(reset_partial_state=True)
