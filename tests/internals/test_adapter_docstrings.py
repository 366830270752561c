"""Every function of the adapter (``torchkiln._internals``) says what it reads and on which
torch releases it was verified (docs/internals.md, "The rule")."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = [
    "accelerate",
    "autograd",
    "diffusers",
    "dynamo",
    "fake_tensor",
    "fsdp",
    "hub_kernels",
    "inductor",
    "nn_module",
    "transformers",
]
"""The adapter modules checked here (``versions`` reads no private name; ``cache_entries`` and
``aot_artifacts`` join when each of their functions says it too)."""


@pytest.mark.parametrize("name", MODULES)
def test_each_adapter_function_names_the_releases_it_was_verified_on(name: str) -> None:
    module = importlib.import_module(f"torchkiln._internals.{name}")
    functions = [
        function
        for attribute, function in vars(module).items()
        if inspect.isfunction(function)
        and function.__module__ == module.__name__
        and not attribute.startswith("_")
    ]
    assert functions, f"torchkiln._internals.{name} defines no function"
    unverified = [f.__name__ for f in functions if "Verified: torch" not in (f.__doc__ or "")]
    assert not unverified, f"torchkiln._internals.{name}: no 'Verified: torch ...' in {unverified}"
