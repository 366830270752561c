"""Which torch this is, the releases torchkiln is tested on, and what each feature needs.

The supported range is what CI proves: the whole suite on the newest release, the unit suite on
the oldest, the releases between by hand (docs/torch-releases.md). A torch outside it gets one
warning when torchkiln is imported; a feature whose torch API is missing is refused by name and
release when ``compile`` reads its configuration (:func:`feature_problem`), never with an
internal error in the middle of a call.

Nothing here imports torch: the installed release is read from the package metadata, and each
feature's probe runs only when that feature is configured.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import warnings
from collections.abc import Callable

import attrs

OLDEST_TESTED = (2, 11)
NEWEST_TESTED = (2, 15)
TESTED_RANGE = f"{OLDEST_TESTED[0]}.{OLDEST_TESTED[1]} to {NEWEST_TESTED[0]}.{NEWEST_TESTED[1]}"
"""The releases CI and the hand runs prove (pyproject.toml declares ``torch>=2.11,<2.16``)."""


class UntestedTorchWarning(UserWarning):
    """The installed torch is outside the range torchkiln is tested on."""


@functools.cache
def torch_release() -> str:
    """The installed torch's version string (``2.15.0+cu132``), from its package metadata."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def release_tuple(version: str) -> tuple[int, int] | None:
    """``(2, 15)`` for ``2.15.0+cu132`` or ``2.16.0.dev20261101``; ``None`` when unreadable."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def untested_release_message(version: str) -> str | None:
    """Why ``version`` is outside the tested range (``None`` when inside it)."""
    release = release_tuple(version)
    if release is not None and OLDEST_TESTED <= release <= NEWEST_TESTED:
        return None
    return (
        f"torchkiln is tested on torch {TESTED_RANGE}; this is torch {version}. It may work, "
        "but compiles, reports and artifacts are unverified here (docs/torch-releases.md)"
    )


def warn_if_untested() -> None:
    """One :class:`UntestedTorchWarning` when the installed torch is outside the tested range."""
    message = untested_release_message(torch_release())
    if message is not None:
        warnings.warn(message, UntestedTorchWarning, stacklevel=3)


MODULE_COMPILE_TRACES_TORCH_NN = (2, 14)
"""The first release whose ``nn.Module.compile()`` compiles a ``torch.nn`` built-in (``nn.Linear``,
``nn.Sequential``, ``nn.TransformerEncoderLayer``): up to 2.13, Dynamo skips a top frame whose
code lives in ``torch/nn`` and such a module silently runs eagerly (the "built-in trap")."""


def module_compile_skips_torch_nn(version: str | None = None) -> bool:
    """Whether ``nn.Module.compile()`` on a ``torch.nn`` built-in compiles nothing on this torch
    (or ``version``): true on 2.11 to 2.13, false from 2.14 on (tests/engine/test_builtin_trap.py
    checks it against a graph count on every torch leg)."""
    release = release_tuple(version or torch_release())
    return release is not None and release < MODULE_COMPILE_TRACES_TORCH_NN


@attrs.frozen
class Feature:
    """A torchkiln feature that needs an API some supported torch releases lack.

    :param name: the feature as users configure it (``tiered``, ``artifacts``, ...).
    :param needs: the torch API it needs, in words.
    :param since: the first torch release that has it.
    :param probe: whether the installed torch has it (imports torch; called only when needed).
    """

    name: str
    needs: str
    since: str
    probe: Callable[[], bool]

    def missing(self) -> str | None:
        """Why this torch cannot run the feature, naming feature, API and releases."""
        if self.probe():
            return None
        return (
            f"{self.name} needs {self.needs}, which torch {torch_release()} lacks "
            f"(torch {self.since} or later has it)"
        )


def _saves_compiled_functions() -> bool:
    """``torch.compile(fn).aot_compile`` and ``torch.compiler.load_compiled_function``."""
    import torch

    return hasattr(torch.compiler, "load_compiled_function") and callable(
        getattr(torch.compile(lambda value: value, backend="eager"), "aot_compile", None)
    )


def _has_nested_compile_region() -> bool:
    import torch

    return callable(getattr(torch.compiler, "nested_compile_region", None))


SAVED_FUNCTIONS = "torch.compile(...).aot_compile and torch.compiler.load_compiled_function"

FEATURES: dict[str, Feature] = {
    feature.name: feature
    for feature in (
        Feature("tiered compilation", SAVED_FUNCTIONS, "2.13", _saves_compiled_functions),
        Feature("precompiled artifacts", SAVED_FUNCTIONS, "2.13", _saves_compiled_functions),
        Feature(
            "hierarchical compilation",
            "torch.compiler.nested_compile_region",
            "2.11",
            _has_nested_compile_region,
        ),
    )
}


def feature_problem(name: str) -> str | None:
    """Why feature ``name`` (a key of :data:`FEATURES`) cannot run on this torch, or ``None``."""
    return FEATURES[name].missing()
