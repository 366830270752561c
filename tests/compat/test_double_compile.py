"""A model torchkiln compiled, compiled again by ``torch.compile``, ``Module.compile()`` or
Accelerate's dynamo backend: warned about (naming the fix), or raised under
``TORCHKILN_ON_DOUBLE_COMPILE=raise``. Detected inside Dynamo's trace, with no patch of torch."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from accelerate_helpers import compiled_graphs, llama_model, token_ids
from torch import nn

import torchkiln
from torchkiln.engine.double_compile import DoubleCompileWarning, policy


def compile_outer(model: nn.Module) -> Callable[..., object]:
    return torch.compile(model, backend="eager")


def compile_method(model: nn.Module) -> Callable[..., object]:
    model.compile(backend="eager")
    return model


def test_torchkilns_own_compile_is_not_a_double_compile() -> None:
    model = torchkiln.compile(llama_model(), backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DoubleCompileWarning)
        model(token_ids())
    assert compiled_graphs() == 1  # the block graph, traced as Dynamo's top frame


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    ("outer", "called_first"),
    [
        (compile_outer, True),
        pytest.param(compile_method, True, marks=SLOW),
        pytest.param(compile_outer, False, marks=SLOW),
    ],
    ids=["torch.compile", "Module.compile", "torch.compile-before-the-first-call"],
)
def test_a_second_compile_is_warned_about(outer, called_first: bool) -> None:
    model = torchkiln.compile(llama_model(), backend="eager")
    if called_first:
        model(token_ids())
    compiled = outer(model)
    with pytest.warns(DoubleCompileWarning) as caught:
        compiled(token_ids())
    message = next(str(w.message) for w in caught if w.category is DoubleCompileWarning)
    if called_first:  # Dynamo inlines the region's compiled function
        assert "tracing into torchkiln's compiled region group 'LlamaDecoderLayer'" in message
    else:  # Dynamo meets the region's first-call shim
        assert "region group 'LlamaDecoderLayer' before its first call" in message
    assert "drop the outer compile (torch.compile(model) / model.compile())" in message
    assert "Set TORCHKILN_ON_DOUBLE_COMPILE=raise to make this an error" in message


def test_strict_policy_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    model = torchkiln.compile(llama_model(), backend="eager")
    model(token_ids())
    monkeypatch.setenv("TORCHKILN_ON_DOUBLE_COMPILE", "raise")
    # Raised inside Dynamo's trace, so Dynamo wraps it; its message leads with ours.
    with pytest.raises(torch._dynamo.exc.TorchDynamoException) as raised:
        torch.compile(model, backend="eager")(token_ids())
    assert str(raised.value).startswith("DoubleCompileError: another torch.compile")
    assert "(TORCHKILN_ON_DOUBLE_COMPILE=raise)" in str(raised.value)


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_accelerate")
@pytest.mark.parametrize("regional", ["False", "True"], ids=["whole", "regional"])
def test_accelerates_dynamo_backend_on_a_torchkiln_model_is_warned_about(
    monkeypatch: pytest.MonkeyPatch, regional: str
) -> None:
    """The documented trap: compile with torchkiln, forget ``dynamo_backend="no"`` while
    ``accelerate launch`` exports a dynamo backend. No ``install()`` here."""
    from accelerate import Accelerator

    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "EAGER")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", regional)
    model = torchkiln.compile(llama_model(), backend="eager")
    prepared = Accelerator(cpu=True).prepare(model)
    assert prepared is not model  # Accelerate wrapped (whole) or copied (regional) it
    with pytest.warns(DoubleCompileWarning, match="Accelerator\\(dynamo_backend='no'\\)"):
        prepared(token_ids())


def test_off_policy_allows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    model = torchkiln.compile(llama_model(), backend="eager")
    model(token_ids())
    monkeypatch.setenv("TORCHKILN_ON_DOUBLE_COMPILE", "off")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DoubleCompileWarning)
        torch.compile(model, backend="eager")(token_ids())


def test_bad_policy_names_the_variable_and_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    assert policy() == "warn"
    monkeypatch.setenv("TORCHKILN_ON_DOUBLE_COMPILE", " RAISE ")
    assert policy() == "raise"
    monkeypatch.setenv("TORCHKILN_ON_DOUBLE_COMPILE", "error")
    with pytest.raises(torchkiln.ConfigError) as raised:
        policy()
    assert "$TORCHKILN_ON_DOUBLE_COMPILE (from env:TORCHKILN_ON_DOUBLE_COMPILE): 'error'" in str(
        raised.value
    )


def test_the_advice_follows_whether_install_is_in_effect() -> None:
    """Issue 41: the warning told the user to call ``torchkiln.compat.accelerate.install()``
    even while it was in effect. The state is read from ``is_installed()`` as the user sees it."""
    pytest.importorskip("accelerate")
    from torchkiln.compat import accelerate as kiln

    def message() -> str:
        torch.compiler.reset()  # the check runs while Dynamo traces: trace afresh each time
        model = torchkiln.compile(llama_model(), backend="eager")
        model(token_ids())
        with pytest.warns(DoubleCompileWarning) as caught:
            torch.compile(model, backend="eager")(token_ids())
        return next(str(w.message) for w in caught if w.category is DoubleCompileWarning)

    assert not kiln.is_installed()
    assert "or call torchkiln.compat.accelerate.install() so that" in message()
    with kiln.install():
        assert kiln.is_installed()
        installed = message()
    assert "torchkiln.compat.accelerate.install() is in effect" in installed
    assert "call torchkiln.compat.accelerate.install()" not in installed
    assert "TorchDynamoPlugin(use_regional_compilation=True)" in installed
