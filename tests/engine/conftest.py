"""Fixtures for the engine tests: a clean Dynamo, a clean environment, the model matrix."""

from __future__ import annotations

import pytest
from engine_zoo import CASES, ModelCase


@pytest.fixture(autouse=True)
def fresh_dynamo(reset_dynamo: None) -> None:
    """Every test starts with no compiled code and zeroed counters, so graph counts are its own."""


@pytest.fixture(autouse=True)
def clean_environment(torchkiln_clean_environment: None) -> None:
    """No TORCHKILN_* / ACCELERATE_* variable or ./torchkiln.yaml reaches a test."""


@pytest.fixture(params=CASES, ids=lambda case: case.name)
def case(request: pytest.FixtureRequest) -> ModelCase:
    return request.param
