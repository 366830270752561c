"""The Accelerate dynamo helpers on torchkiln. Users import them from
:mod:`torchkiln.compat.accelerate`, which says what is kept from Accelerate and what changed.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import attrs
from torch import nn

from torchkiln._internals import dynamo
from torchkiln._internals.accelerate import (
    drop_orig_mod,
    has_fp32_wrapper,
    has_orig_mod,
    set_orig_mod,
)
from torchkiln.compat.accelerate_settings import (
    BACKEND_MAP,
    ENV_BACKEND,
    ENV_DYNAMIC,
    ENV_FULLGRAPH,
    ENV_MODE,
    ENV_REGIONAL,
    DynamoBackend,
    env_truth,
    parse_backend,
    torchkiln_backend,
)
from torchkiln.compat.unwrap import (
    LIVE_STATUSES,
    live_regions,
    root_copy_without_fp32_wrapper,
    uncompiled_twin,
)
from torchkiln.configuration.config import CompileConfig
from torchkiln.distributed import container_layer, peel
from torchkiln.engine import double_compile
from torchkiln.engine.compile_state import CompileState, region_state_of, state_of
from torchkiln.engine.region_runtime import RegionRuntime

TORCH_COMPILE_DEFAULTS: Mapping[str, Any] = {
    "backend": "inductor",
    "mode": None,
    "fullgraph": False,
    "dynamic": None,
    "options": None,
    "disable": False,
}
"""``torch.compile``'s defaults: passed explicitly so that neither ``TORCHKILN_*`` nor
``ACCELERATE_DYNAMO_*`` variables change what a ``compile_regions`` call means."""

ACCELERATE_REGIONS: Mapping[str, str] = {"strategy": "auto", "rest": "leaves"}
"""Accelerate's regional selection: the repeated blocks plus the rest compiled separately,
or the whole model when it has no repeated blocks."""

_PASSED_THROUGH = frozenset(f.name for f in attrs.fields(CompileConfig)) - {"distributed"}

# Region module -> its root, so a block can be asked ``is_compiled_module`` on its own.
_REGION_ROOTS: weakref.WeakKeyDictionary[nn.Module, weakref.ref[nn.Module]] = (
    weakref.WeakKeyDictionary()
)


# --- TorchDynamoPlugin ------------------------------------------------------------------------


_PLUGIN_DEFAULTS: Mapping[str, Any] = {
    **TORCH_COMPILE_DEFAULTS,
    "backend": "no",
    "mode": "default",
    "use_regional_compilation": False,
}
"""What ``TorchDynamoPlugin()`` holds with no ``ACCELERATE_DYNAMO_*`` variable set (in
``to_dict()`` form): ``to_kwargs()`` reports the fields that differ from it."""


# A dataclass, not attrs, on purpose: code written for Accelerate's plugin may use
# dataclasses.replace / asdict / fields on it.
@dataclasses.dataclass
class TorchDynamoPlugin:
    """Accelerate's ``TorchDynamoPlugin``: same fields, defaults and environment variables.

    A field left ``None`` is read from ``ACCELERATE_DYNAMO_*`` (backend ``NO``, mode
    ``default``, fullgraph and regional compilation off when unset). One difference: a false
    ``ACCELERATE_DYNAMO_USE_DYNAMIC`` leaves ``dynamic`` at ``None`` (``accelerate launch``
    exports ``False`` even when nobody chose it); pass ``dynamic=False`` to force it.
    """

    backend: DynamoBackend | str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        source = "argument"
        if self.backend is None:
            source = f"env:{ENV_BACKEND}"
            self.backend = os.environ.get(ENV_BACKEND, "").strip() or DynamoBackend.NO
        self.backend = parse_backend(self.backend, "$.backend", source)
        if self.mode is None:
            self.mode = os.environ.get(ENV_MODE, "").strip() or "default"
        if self.fullgraph is None:
            self.fullgraph = env_truth(ENV_FULLGRAPH, "$.fullgraph") is True
        if self.use_regional_compilation is None:
            self.use_regional_compilation = env_truth(ENV_REGIONAL, "$.regions") is True
        if self.dynamic is None and env_truth(ENV_DYNAMIC, "$.dynamic") is True:
            self.dynamic = True

    def to_dict(self) -> dict[str, Any]:
        """Every field, the backend as its lower-case name."""
        values = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)}
        values["backend"] = DynamoBackend(values["backend"]).value.lower()
        return values

    def to_kwargs(self) -> dict[str, Any]:
        """The ``torch.compile`` keyword arguments that differ from the defaults (as Accelerate:
        ``use_regional_compilation`` is not one of them)."""
        kwargs = {k: v for k, v in self.to_dict().items() if _PLUGIN_DEFAULTS[k] != v}
        kwargs.pop("use_regional_compilation", None)
        return kwargs

    def to_torchkiln(self) -> dict[str, Any]:
        """Keyword options for :func:`torchkiln.compile` meaning the same as this plugin:
        Accelerate's backend name mapped to torchkiln's, regional compilation as
        ``regions``."""
        backend = DynamoBackend(self.backend or DynamoBackend.NO)  # __post_init__ filled it
        whole = {"strategy": "whole"}
        return {
            "backend": torchkiln_backend(backend, "$.backend", "argument"),
            "mode": None if self.mode in (None, "default") else self.mode,
            "fullgraph": bool(self.fullgraph),
            "dynamic": self.dynamic,
            "options": dict(self.options or {}),
            "disable": self.disable,
            "regions": dict(ACCELERATE_REGIONS) if self.use_regional_compilation else whole,
        }


# --- compiling --------------------------------------------------------------------------------


def compile_regions(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Regional compilation, in place: Accelerate's ``compile_regions`` on torchkiln.

    Compiles every repeated block (found in ``nn.ModuleList``, ``nn.Sequential``,
    ``nn.ModuleDict`` and nested containers) with one compiled function per block class, and
    each parameterised leaf outside them (``lm_head``, embeddings, final norm) on its own; a
    model without repeated blocks is compiled whole.

    :param module: the model, or a DDP / DataParallel / DeepSpeed engine holding it (the
        module inside is compiled; the wrapper is not touched otherwise).
    :param compile_kwargs: ``torch.compile`` arguments (``backend`` — a name or a
        :class:`DynamoBackend` —, ``mode``, ``fullgraph``, ``dynamic``, ``options``,
        ``disable``); torchkiln ``CompileConfig`` fields (``regions``, ``on_region_error``,
        ``cache_dir`` ...) are accepted too.
    :return: ``module`` itself; ``module._orig_mod is module``, so code that reads
        ``_orig_mod`` keeps working, and ``state_dict()`` keys are unchanged. On a model
        already compiled by torchkiln, ``module`` as it is: silently if it was compiled here
        with the same options, else as a double compile (docs/double-compile.md).
    """
    compiled, state = _compile_in_place(module, compile_kwargs)
    if compiled:  # a model compiled before is returned as it is
        set_orig_mod(module, module)  # not a submodule: never in state_dict() or children()
    if compiled and state is not None:  # torchkiln.decompile takes it away again
        state.restore.append(lambda: drop_orig_mod(module))
    return module


def compile_regions_deepspeed(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Accelerate's DeepSpeed variant (it gets ``engine.module``): the same in-place regional
    compile as :func:`compile_regions`. Returns ``module`` (Accelerate returns ``None``)."""
    _compile_in_place(module, compile_kwargs, "compile_regions_deepspeed")
    return module


def compile_regions_fsdp2(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Accelerate's FSDP2 variant (called before ``fully_shard``): the same in-place regional
    compile as :func:`compile_regions`. Block classes, hooks and paths stay as they are, so
    ``fully_shard``'s hooks added afterwards run around the compiled blocks. In a job, the
    groups are shared between ranks through torch's caches, as under torchkiln's own
    ``fsdp2`` (docs/jobs.md): a sharded block cannot load a saved function."""
    from torchkiln.jobs import sharded_after_compile

    with sharded_after_compile("fsdp2"):
        _compile_in_place(module, compile_kwargs, "compile_regions_fsdp2")
    return module


# Compiled model -> the torchkiln options compile_regions compiled it with.
_COMPILED_WITH: weakref.WeakKeyDictionary[nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()


def _compile_in_place(
    module: nn.Module, compile_kwargs: Mapping[str, Any], name: str = "compile_regions"
) -> tuple[bool, CompileState | None]:
    """Compile the model inside ``module`` once. A second call, on the model or on a wrapper
    of it (``prepare`` twice, ``DataParallel`` after compiling), returns it as it is: silently
    with the options it was compiled with here, else as a double compile (warned or raised by
    ``TORCHKILN_ON_DOUBLE_COMPILE``). The same on the import path and under ``install()``.
    Returns whether it compiled now, and the model's compile state."""
    import torchkiln

    target = peel(module, container_layer)
    options = torchkiln_options(compile_kwargs)
    if torchkiln.is_compiled(target):
        if _COMPILED_WITH.get(target) != options:
            double_compile.report(
                f"{name}(backend={options['backend']!r})", stacklevel=3, left_as_is=True
            )
        return False, state_of(target)
    torchkiln.compile(target, **options)
    _COMPILED_WITH[target] = options
    _remember_regions(target)
    return True, state_of(target)


def torchkiln_options(compile_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``torch.compile`` keyword arguments as complete :func:`torchkiln.compile` options."""
    unknown = sorted(set(compile_kwargs) - _PASSED_THROUGH)
    if unknown:
        raise TypeError(
            f"unexpected keyword argument(s) {', '.join(unknown)}; allowed: torch.compile's "
            f"{', '.join(TORCH_COMPILE_DEFAULTS)} and torchkiln's "
            f"{', '.join(sorted(_PASSED_THROUGH - set(TORCH_COMPILE_DEFAULTS)))}"
        )
    options = {**TORCH_COMPILE_DEFAULTS, "regions": dict(ACCELERATE_REGIONS), **compile_kwargs}
    options["backend"] = backend_name(options["backend"])
    options["options"] = dict(options["options"] or {})
    if options["mode"] == "default":
        options["mode"] = None
    options["distributed"] = "none"
    return options


def backend_name(backend: Any) -> str:
    """A ``torch.compile`` / Accelerate backend argument as a torchkiln backend name."""
    if isinstance(backend, DynamoBackend):
        return torchkiln_backend(backend, "$.backend", "argument")
    if isinstance(backend, str):
        member = DynamoBackend.__members__.get(backend.strip().upper())
        mapped = BACKEND_MAP[member].torchkiln if member is not None else None
        return mapped or backend
    raise TypeError(
        f"backend must be a name, not {type(backend).__name__}: torchkiln compiles with named "
        "backends. Register a callable with torch._dynamo.register_backend(name=...) (or as a "
        "torchkiln plugin) and pass its name."
    )


def _remember_regions(root: nn.Module) -> None:
    reference = weakref.ref(root)
    for region in live_regions(state_of(root)):
        _REGION_ROOTS[region.region.module] = reference


# --- inspecting -------------------------------------------------------------------------------


def is_compiled_module(module: nn.Module) -> bool:
    """Whether ``module``'s own forward is compiled: a ``torch.compile`` wrapper, a model
    torchkiln compiled whole, or one region (a block, ``lm_head``) of a torchkiln-compiled
    model. A model compiled regionally is not (as in Accelerate): see
    :func:`has_compiled_regions`."""
    if isinstance(module, dynamo.optimized_module_type()):
        return True
    if any(r.region.path == "" for r in live_regions(state_of(module))):
        return True
    reference = _REGION_ROOTS.get(module)
    root = reference() if reference is not None else None
    if root is not None:
        return any(r.region.module is module for r in live_regions(state_of(root)))
    return _looks_like_torchkiln_region(module)


def _looks_like_torchkiln_region(module: nn.Module) -> bool:
    """A region of a model compiled by ``torchkiln.compile`` directly (no root at hand): its
    instance ``forward`` is torchkiln's region runtime, or the group's compiled function
    (named ``torchkiln_<group>_<n>``) bound to it."""
    forward = module.__dict__.get("forward")
    if forward is None:
        return False
    region = region_state_of(module)
    if region is not None and region.status in LIVE_STATUSES:
        return True  # torchkiln's own record of the region (its forward is named "forward")
    if isinstance(forward, RegionRuntime):
        return True
    function = getattr(forward, "__func__", None)
    return getattr(forward, "__self__", None) is module and getattr(
        function, "__name__", ""
    ).startswith("torchkiln_")


def has_compiled_regions(module: nn.Module) -> bool:
    """Whether ``module`` or anything inside it is compiled (by torch.compile or torchkiln)."""
    target = peel(module, container_layer)
    for submodule in target.modules():
        if live_regions(state_of(submodule)):
            _remember_regions(submodule)
            return True
    return any(is_compiled_module(submodule) for submodule in target.modules())


# --- unwrapping -------------------------------------------------------------------------------


def extract_model_from_parallel(
    model: nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> nn.Module:
    """The plain model behind DDP, DataParallel, FSDP (v1) or a DeepSpeed engine.

    Never modifies ``model``:

    * ``keep_torch_compile=False`` on a torchkiln-compiled model returns the model itself, the
      same object on every call, its regions still compiled (compile is in place: there is no
      other original, and ``unwrapped is model`` and hooks registered on it hold); run it
      eagerly with ``torch.compiler.set_stance("force_eager")``. On a ``torch.compile``
      wrapper: its ``_orig_mod``;
    * ``keep_fp32_wrapper=False`` drops the autocast wrapper ``Accelerator.prepare`` put on
      ``forward`` from a copy of the root, not from the prepared model;
    * with ``keep_torch_compile=True`` around a wrapper (``torch.compile(DDP(model))``) the
      result is a new ``torch.compile`` wrapper of the plain module; the prepared one keeps
      its DDP.

    :raises NotImplementedError: for ``recursive=True`` (Accelerate uses it for sub-layer
        wrappers of FSDP on XLA, which torchkiln never creates).
    """
    if recursive:
        raise NotImplementedError(
            "recursive=True unwraps wrapped sub-layers (FSDP on XLA) by rewriting the model's "
            "children; torchkiln never wraps sub-layers and never modifies the prepared model"
        )
    optimized = model if isinstance(model, dynamo.optimized_module_type()) else None
    plain = peel(dynamo.original_module(model) if optimized is not None else model, container_layer)
    if not keep_fp32_wrapper:
        plain = _without_fp32_wrapper_keeping_compile(plain)
    if optimized is None or not keep_torch_compile:
        return plain
    if dynamo.original_module(optimized) is plain:
        return optimized
    return dynamo.rewrapped(plain, optimized)


def _without_fp32_wrapper_keeping_compile(plain: nn.Module) -> nn.Module:
    if not has_fp32_wrapper(plain):
        return plain
    if any(r.region.path == "" for r in live_regions(state_of(plain))):
        # The wrapper is inside the root's compiled code: it cannot be taken out of it.
        warnings.warn(
            "keep_fp32_wrapper=False on a model compiled whole: the autocast wrapper is part "
            "of the compiled forward, so an uncompiled copy without it is returned",
            RuntimeWarning,
            stacklevel=3,
        )
        return uncompiled_twin(plain)
    twin = root_copy_without_fp32_wrapper(plain)
    if has_orig_mod(plain):
        set_orig_mod(twin, twin)
    return twin
