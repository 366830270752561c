"""A second ``compile_regions`` on a model torchkiln compiled (Accelerate users prepare twice,
or wrap the model in ``DataParallel`` after compiling it) does the same on the import path and
under ``install()``: with the options it was compiled with, the model comes back as it is,
silently; otherwise as a double compile, with one message on both paths, whose advice fits
whether ``install()`` is in effect."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from accelerate_helpers import compiled_graphs, llama_model, token_ids
from torch import nn

import torchkiln
from torchkiln.compat import accelerate as kiln
from torchkiln.engine.double_compile import (
    FIX_LEFT,
    FIX_LEFT_INSTALLED,
    DoubleCompileError,
    DoubleCompileWarning,
)

accelerate_utils = pytest.importorskip("accelerate.utils")


@contextlib.contextmanager
def compile_regions_of(path: str) -> Iterator[Callable[..., Any]]:
    """``compile_regions`` as a user of ``path`` calls it."""
    if path == "import":
        yield kiln.compile_regions
        return
    with kiln.install():
        yield accelerate_utils.compile_regions


PATHS = ["import", "installed"]


@pytest.mark.parametrize("path", PATHS)
def test_the_same_options_again_return_the_model_silently(path: str) -> None:
    with compile_regions_of(path) as compile_regions:
        model = compile_regions(llama_model(), backend="eager")
        model(token_ids())
        graphs = compiled_graphs()
        wrapped = nn.DataParallel(model)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert compile_regions(model, backend="eager") is model
            assert compile_regions(wrapped, backend="eager") is wrapped
    wrapped(token_ids())
    assert compiled_graphs() == graphs  # nothing traced again
    assert wrapped.module is model and torchkiln.is_compiled(model)


def second_compile_message(path: str, first: Callable[[nn.Module], nn.Module]) -> str:
    with compile_regions_of(path) as compile_regions:
        model = first(llama_model())
        with pytest.warns(DoubleCompileWarning) as caught:
            assert compile_regions(model, backend="aot_eager") is model
    [warning] = [w for w in caught if w.category is DoubleCompileWarning]
    return str(warning.message)


ADVICE_TAIL = " Set TORCHKILN_ON_DOUBLE_COMPILE=raise to make this an error, or =off to allow it."


@pytest.mark.parametrize(
    "first",
    [
        lambda model: kiln.compile_regions(model, backend="eager"),
        lambda model: torchkiln.compile(model, backend="eager"),
    ],
    ids=["other-options", "torchkiln.compile"],
)
def test_other_options_are_one_double_compile_message_on_both_paths(first: Any) -> None:
    """One report on both paths; its advice fits each (issue 41: under install() it told the
    user to call install())."""
    messages = {path: second_compile_message(path, first) for path in PATHS}
    said = (
        "compile_regions(backend='aot_eager') was asked to compile a model torchkiln already "
        "compiled, with other options (a double compile; the model is left as it is). "
    )
    assert messages["import"].startswith(said) and messages["installed"].startswith(said)
    assert messages["import"] == said + FIX_LEFT + ADVICE_TAIL
    assert messages["installed"] == said + FIX_LEFT_INSTALLED + ADVICE_TAIL
    assert "call torchkiln.compat.accelerate.install()" not in messages["installed"]
    assert all("torchkiln.decompile(model) first" in m for m in messages.values())


@pytest.mark.parametrize("path", PATHS)
def test_under_raise_both_paths_raise(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHKILN_ON_DOUBLE_COMPILE", "raise")
    with compile_regions_of(path) as compile_regions:
        model = compile_regions(llama_model(), backend="eager")
        with pytest.raises(DoubleCompileError, match="TORCHKILN_ON_DOUBLE_COMPILE=raise"):
            compile_regions(model, backend="aot_eager")
    assert torchkiln.is_compiled(model)
