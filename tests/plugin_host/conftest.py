"""The plugin system (torchkiln.plugin_host, torchkiln.plugin, torchkiln.testing); every test here
runs with a clean environment."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def clean_environment(torchkiln_clean_environment: None) -> None:
    """No TORCHKILN_* / ACCELERATE_* variable or ./torchkiln.yaml reaches a test."""
