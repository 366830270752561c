"""Fixtures for the report tests (torchkiln.reporting): a clean Dynamo, a clean environment."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def fresh_dynamo(reset_dynamo: None) -> None:
    """Every test starts with no compiled code and zeroed counters, so graph counts are its own."""


@pytest.fixture(autouse=True)
def clean_environment(torchkiln_clean_environment: None) -> None:
    """No TORCHKILN_* / ACCELERATE_* variable or ./torchkiln.yaml reaches a test."""
