"""``install()``: an unmodified Accelerate ``Accelerator`` compiles with torchkiln.

Accelerate's modules bind its compile helpers at import time
(``from .utils.other import compile_regions, ...`` in ``accelerate.accelerator``), so
replacing ``accelerate.utils.compile_regions`` alone changes nothing. :func:`install` imports
Accelerate and puts torchkiln's version of each helper (``compile_regions`` and its DeepSpeed
and FSDP2 variants, ``is_compiled_module``, ``has_compiled_regions``,
``extract_model_from_parallel``) in every ``accelerate`` module that holds it, found by
identity so that aliases count. Only Accelerate's regional path goes through these names; its
whole-model ``torch.compile`` is left as it is (changing it would mean patching torch).
docs/integrations/accelerate.md says what each replacement does.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import attrs
from torch import nn

from torchkiln._internals import dynamo
from torchkiln._internals.accelerate import has_orig_mod
from torchkiln.compat import accelerate_helpers as kiln
from torchkiln.compat.accelerate_settings import ENV_DYNAMIC, env_truth
from torchkiln.engine import double_compile

REPLACED = (
    "compile_regions",
    "compile_regions_deepspeed",
    "compile_regions_fsdp2",
    "is_compiled_module",
    "has_compiled_regions",
    "extract_model_from_parallel",
)
"""The helpers of ``accelerate.utils.other`` that :func:`install` replaces."""

ACCELERATE_MODULES = ("accelerate.accelerator", "accelerate.utils.fsdp_utils")
"""Imported by :func:`install` so that every module binding the helpers is loaded first."""

_LOCK = threading.Lock()
_active: Installation | None = None


@attrs.define(eq=False)
class Binding:
    """One module attribute that :func:`install` replaced."""

    module: types.ModuleType
    name: str
    original: Any
    replacement: Any


@attrs.define(eq=False)
class Installation:
    """What :func:`install` replaced; a context manager that uninstalls on exit.

    ``owner`` is false for the handle a second :func:`install` returns while one is active:
    leaving its ``with`` block keeps the first installation.
    """

    bindings: list[Binding]
    originals: dict[str, Any]
    replacements: dict[str, Any]
    owner: bool = True

    def uninstall(self) -> bool:
        """Restore Accelerate's helpers (see :func:`uninstall`), if this handle installed them."""
        return uninstall() if self.owner and _active is self else False

    def __enter__(self) -> Installation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


def install() -> Installation:
    """Make an unmodified ``Accelerator`` compile with torchkiln (see the module docstring).

    Idempotent: while an installation is active, another call changes nothing and returns a
    handle that does not uninstall. Usable as a context manager::

        with torchkiln.compat.accelerate.install():
            model = accelerator.prepare(model)   # regional compile: torchkiln's, in place

    :raises ImportError: when Accelerate is not installed.
    :raises ConfigError: for a bad ``TORCHKILN_ON_DOUBLE_COMPILE``.
    """
    global _active
    double_compile.policy()  # a bad value fails here, not in the middle of prepare
    with _LOCK:
        if _active is not None:
            return Installation(_active.bindings, _active.originals, _active.replacements, False)
        originals = _accelerate_originals()
        replacements = _replacements(originals)
        bindings = _rebind(originals, replacements)
        _active = Installation(bindings, originals, replacements)
        return _active


def uninstall() -> bool:
    """Put back every object :func:`install` replaced, exactly (the same objects), also in
    ``accelerate`` modules imported after :func:`install` that bound a replacement.
    ``False`` when nothing was installed."""
    global _active
    with _LOCK:
        if _active is None:
            return False
        for binding in _active.bindings:
            if binding.module.__dict__.get(binding.name) is binding.replacement:
                setattr(binding.module, binding.name, binding.original)
        by_id = {id(new): _active.originals[name] for name, new in _active.replacements.items()}
        for module in _accelerate_modules():
            for name, value in list(vars(module).items()):
                if id(value) in by_id:
                    setattr(module, name, by_id[id(value)])
        _active = None
        return True


def is_installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _active is not None


def _accelerate_originals() -> dict[str, Any]:
    import importlib

    try:
        other = importlib.import_module("accelerate.utils.other")
        for name in ACCELERATE_MODULES:
            importlib.import_module(name)
    except ImportError as error:
        raise ImportError(
            "torchkiln.compat.accelerate.install() needs Accelerate: "
            "pip install 'torchkiln[accelerate]'"
        ) from error
    missing = [name for name in REPLACED if not callable(getattr(other, name, None))]
    if missing:
        version = getattr(sys.modules.get("accelerate"), "__version__", "unknown version")
        raise ImportError(
            f"this Accelerate ({version}) has no {', '.join(missing)} in "
            "accelerate.utils.other; install() supports Accelerate >= 1.10"
        )
    return {name: getattr(other, name) for name in REPLACED}


def _accelerate_modules() -> list[types.ModuleType]:
    return [
        module
        for name, module in list(sys.modules.items())
        if isinstance(module, types.ModuleType)
        and (name == "accelerate" or name.startswith("accelerate."))
    ]


def _rebind(originals: dict[str, Any], replacements: dict[str, Any]) -> list[Binding]:
    by_id = {id(function): name for name, function in originals.items()}
    bindings = []
    for module in _accelerate_modules():
        for attribute, value in list(vars(module).items()):
            name = by_id.get(id(value))
            if name is not None:
                bindings.append(Binding(module, attribute, value, replacements[name]))
                setattr(module, attribute, replacements[name])
    return bindings


# --- the replacements -------------------------------------------------------------------------


def _replacements(originals: dict[str, Any]) -> dict[str, Any]:
    compilers = (kiln.compile_regions, kiln.compile_regions_deepspeed, kiln.compile_regions_fsdp2)
    return {
        **{function.__name__: _compiling(function) for function in compilers},
        "is_compiled_module": is_compiled_module,
        "has_compiled_regions": kiln.has_compiled_regions,
        "extract_model_from_parallel": _extracting(originals["extract_model_from_parallel"]),
    }


def _compiling(compile_function: Callable[..., nn.Module]) -> Callable[..., Any]:
    name = compile_function.__name__

    def compile_regions(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
        # a model compiled already is returned as on the import path (_compile_in_place)
        return compile_function(module, **launcher_dynamic_unforced(compile_kwargs))

    compile_regions.__name__ = compile_regions.__qualname__ = name
    compile_regions.__doc__ = (
        f"Accelerate's ``{name}``, installed by torchkiln: an in-place regional compile."
    )
    return compile_regions


def launcher_dynamic_unforced(compile_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``dynamic=False`` that only reflects ``accelerate launch``'s exported
    ``ACCELERATE_DYNAMO_USE_DYNAMIC=False`` becomes ``None`` (torch's automatic dynamic shapes),
    as everywhere in torchkiln: forced static shapes make blocks that share compiled code
    recompile per sequence length until the recompile limit."""
    if compile_kwargs.get("dynamic") is False and env_truth(ENV_DYNAMIC, "$.dynamic") is False:
        return {**compile_kwargs, "dynamic": None}
    return dict(compile_kwargs)


def is_compiled_module(module: nn.Module) -> bool:
    """Accelerate's question "is this a compile wrapper whose ``_orig_mod`` I can read?": a
    ``torch.compile`` wrapper, or a model whose own forward ``compile_regions`` compiled (the
    whole-model fallback; ``_orig_mod`` is the model itself). A model torchkiln compiled
    without ``compile_regions`` has no ``_orig_mod``: Accelerate then asks to compile it, and
    the double compile is reported."""
    if isinstance(module, dynamo.optimized_module_type()):
        return True
    return has_orig_mod(module) and kiln.is_compiled_module(module)


def _extracting(original: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    def extract_model_from_parallel(
        model: nn.Module,
        keep_fp32_wrapper: bool = True,
        keep_torch_compile: bool = True,
        recursive: bool = False,
    ) -> nn.Module:
        if recursive:  # FSDP on XLA: Accelerate's own (a torchkiln model has nothing to unwrap)
            return original(model, keep_fp32_wrapper, keep_torch_compile, recursive)
        return kiln.extract_model_from_parallel(model, keep_fp32_wrapper, keep_torch_compile)

    extract_model_from_parallel.__doc__ = kiln.extract_model_from_parallel.__doc__
    return extract_model_from_parallel


__all__ = ["REPLACED", "Installation", "install", "is_installed", "uninstall"]
