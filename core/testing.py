"""Testing support for torchkiln plugin authors; also a pytest plugin.

Installing torchkiln registers this module with pytest (entry point ``pytest11``), which adds
the :func:`torchkiln_plugin_manager` and :func:`torchkiln_clean_environment` fixtures to every
test session. It imports neither torch nor any vendor library until a helper is called, so it
costs nothing in test suites that do not use it. docs/plugins/testing.md says how to use them
with :func:`register_plugin` and :func:`assert_backend_matches_eager`.

>>> from torchkiln.testing import assert_backend_matches_eager
>>> check = assert_backend_matches_eager("aot_eager")
>>> check.graphs >= 1
True
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import pytest

if TYPE_CHECKING:
    import torch
    from torch import nn

    from torchkiln.plugin_host.plugin_manager import PluginManager

__all__ = [
    "BackendCheck",
    "assert_backend_matches_eager",
    "isolated_plugin_manager",
    "output_tensors",
    "register_plugin",
    "small_inputs",
    "small_model",
    "torchkiln_clean_environment",
    "torchkiln_plugin_manager",
]


def isolated_plugin_manager(*plugins: object) -> PluginManager:
    """A manager with the built-ins and ``plugins``; no entry points, no environment controls."""
    from torchkiln.plugin_host.plugin_manager import PluginManager

    manager = PluginManager(entry_points=False, env={})
    for plugin in plugins:
        manager.register(plugin)
    return manager


@pytest.fixture
def torchkiln_clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[None]:
    """Run the test in ``tmp_path`` with no ``TORCHKILN_*`` / ``ACCELERATE_*`` variables, with
    a process-wide plugin manager built for it (the manager reads the environment when created)."""
    from torchkiln.plugin_host.default_manager import reset_plugin_manager

    for name in list(os.environ):
        if name.startswith(("TORCHKILN_", "ACCELERATE_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    reset_plugin_manager()
    yield
    reset_plugin_manager()


@pytest.fixture
def torchkiln_plugin_manager() -> PluginManager:
    """An isolated :class:`torchkiln.PluginManager`: the built-in plugins only.

    Installed plugins (the ``torchkiln`` entry-point group) are not loaded, and
    ``TORCHKILN_PLUGINS`` / ``TORCHKILN_DISABLED_PLUGINS`` are ignored, so a test sees the same
    plugins on every machine. Register yours with ``manager.register(plugin)`` and pass the
    manager on: ``torchkiln.compile(model, plugins=manager)``.
    """
    return isolated_plugin_manager()


@contextlib.contextmanager
def register_plugin(
    manager: PluginManager | None, plugin: object, name: str | None = None
) -> Iterator[PluginManager]:
    """Register ``plugin`` with ``manager`` (``None``: the process-wide default manager) for the
    duration of the ``with`` block, and unregister it afterwards, even on error.

    Yields the manager. The plugin is registered last, so its hooks run first and the backends
    it declares win over built-ins of the same name.
    """
    if manager is None:
        from torchkiln.plugin_host.default_manager import get_plugin_manager

        manager = get_plugin_manager()
    manager.ensure_loaded()  # loaded now, so entry points cannot register after (and above) it
    registered = manager.register(plugin, name=name)
    try:
        yield manager
    finally:
        if registered is not None and manager.get_plugin(registered) is not None:
            manager.unregister(name=registered)


# --- the default model -----------------------------------------------------------------------


@functools.cache
def _model_classes() -> tuple[type[nn.Module], type[nn.Module]]:
    """Built on first use (torch is imported only then), once per process."""
    import torch.nn.functional as F
    from torch import nn

    class TinyBlock(nn.Module):
        """A pre-norm MLP block with a residual: the region torchkiln compiles."""

        def __init__(self, width: int) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(width)
            self.up = nn.Linear(width, 2 * width)
            self.down = nn.Linear(2 * width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(F.gelu(self.up(self.norm(x))))

    class TinyModel(nn.Module):
        """``depth`` repeated :class:`TinyBlock` s and a head."""

        def __init__(self, depth: int = 2, width: int = 16) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(TinyBlock(width) for _ in range(depth))
            self.head = nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return TinyBlock, TinyModel


def small_model(depth: int = 2, width: int = 16, seed: int = 0) -> nn.Module:
    """A tiny model of ``depth`` repeated blocks (so ``regions="auto"`` finds them)."""
    import torch

    torch.manual_seed(seed)
    return _model_classes()[1](depth, width)


def small_inputs(width: int = 16, batch: int = 2, seq: int = 4, seed: int = 1) -> torch.Tensor:
    """Inputs for :func:`small_model`."""
    import torch

    return torch.randn(batch, seq, width, generator=torch.Generator().manual_seed(seed))


# --- the backend check ------------------------------------------------------------------------


@attrs.frozen
class BackendCheck:
    """What :func:`assert_backend_matches_eager` measured."""

    backend: str
    graphs: int
    """Graphs Dynamo compiled during the check (``counters["stats"]["unique_graphs"]``)."""
    max_abs_diff: float
    """Largest absolute difference between compiled and eager outputs."""
    gradients_checked: int
    """Parameters whose gradients were compared (0 for an inference-only backend)."""


def output_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a (nested) model output, in order: tensor, tuple/list, mapping, ModelOutput."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [t for item in value.values() for t in output_tensors(item)]
    if isinstance(value, list | tuple):
        return [t for item in value for t in output_tensors(item)]
    return []


def _loss(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    floating = [t for t in tensors if t.is_floating_point() and t.requires_grad]
    if not floating:
        raise AssertionError("the model's outputs have no floating-point tensor requiring grad")
    return sum(t.float().sum() for t in floating)  # type: ignore[return-value]


def _prefixed(prefix: str, message: str) -> str:
    return f"{prefix}: {message}"


def _graphs_so_far() -> int:
    from torchkiln._internals import dynamo

    return int(dynamo.counters()["stats"]["unique_graphs"])


def assert_backend_matches_eager(
    backend: str,
    model: nn.Module | None = None,
    inputs: Any = None,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    plugins: PluginManager | Iterable[object] | None = None,
    training: bool | None = None,
    **options: Any,
) -> BackendCheck:
    """Compile a model with ``backend`` through :func:`torchkiln.compile` and check it.

    Checks that compiling produced at least one graph, that outputs equal eager within
    ``rtol``/``atol`` (``torch.testing.assert_close``), and, when the backend supports training,
    that every parameter's gradient equals eager's. Raises ``AssertionError`` otherwise.

    :param backend: the backend name, as users pass it.
    :param model: the model (default: :func:`small_model`). It is left untouched: one deep
        copy is compiled and compared with another that runs eagerly.
    :param inputs: one tensor, a tuple of positional arguments, or a mapping of keyword
        arguments (default: :func:`small_inputs`).
    :param plugins: a plugin manager, or plugins to register with an isolated one (see
        :func:`isolated_plugin_manager`); default: the process-wide manager, with the installed
        plugins.
    :param training: compare gradients; default: what the backend declares.
    :param options: further :func:`torchkiln.compile` options (``options={...}``, ``mode=...``,
        ``regions=...``).
    """
    import torch

    import torchkiln
    from torchkiln.plugin_host.default_manager import as_plugin_manager

    manager = as_plugin_manager(plugins)
    declared = manager.backends().get(backend.lower())
    if declared is None:
        raise AssertionError(
            f"backend {backend!r} is not registered; registered: {', '.join(sorted(manager.backends()))}"
        )
    if training is None:
        training = declared.spec.training
    if model is None:
        model, inputs = small_model(), small_inputs() if inputs is None else inputs
    if inputs is None:
        raise AssertionError("pass inputs for your model")
    args, kwargs = (
        ((), dict(inputs)) if isinstance(inputs, Mapping)
        else (tuple(inputs), {}) if isinstance(inputs, tuple)
        else ((inputs,), {})
    )  # fmt: skip

    reference, compiled = copy.deepcopy(model), copy.deepcopy(model)
    before = _graphs_so_far()
    compiled = torchkiln.compile(compiled, backend=backend, plugins=manager, **options)
    with torch.set_grad_enabled(training):
        expected = output_tensors(reference(*args, **kwargs))
        actual = output_tensors(compiled(*args, **kwargs))
    graphs = _graphs_so_far() - before
    if graphs < 1:
        raise AssertionError(
            f"backend {backend!r} compiled no graph: torchkiln.report(model) says\n"
            f"{torchkiln.report(compiled)}"
        )
    if len(actual) != len(expected):
        raise AssertionError(
            f"compiled model returned {len(actual)} tensors, eager {len(expected)}"
        )
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        torch.testing.assert_close(
            got, want, rtol=rtol, atol=atol, msg=functools.partial(_prefixed, f"output {index}")
        )
    diff = max((float((g.detach().double() - w.detach().double()).abs().max()) for g, w in zip(actual, expected, strict=True)
                if g.numel()), default=0.0)  # fmt: skip
    checked = (
        _compare_gradients(reference, compiled, expected, actual, rtol, atol) if training else 0
    )
    return BackendCheck(backend.lower(), graphs, diff, checked)


def _compare_gradients(
    model: nn.Module,
    compiled: nn.Module,
    expected: Sequence[torch.Tensor],
    actual: Sequence[torch.Tensor],
    rtol: float,
    atol: float,
) -> int:
    import torch

    _loss(expected).backward()
    _loss(actual).backward()
    compiled_params = dict(compiled.named_parameters())
    checked = 0
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        got = compiled_params[name].grad
        if got is None:
            raise AssertionError(f"parameter {name!r} has a gradient in eager but not compiled")
        torch.testing.assert_close(
            got,
            param.grad,
            rtol=rtol,
            atol=atol,
            msg=functools.partial(_prefixed, f"gradient of {name}"),
        )
        checked += 1
    if checked == 0:
        raise AssertionError("no parameter received a gradient in eager mode")
    return checked
