"""Accelerate's private conventions that torchkiln reads or writes on a model (``_orig_mod``
in a module's ``__dict__``, ``_original_forward``, a hook's ``_hf_hook`` and ``_old_forward``).

Nothing here imports Accelerate.
"""

from __future__ import annotations

import functools
from typing import Any

_ORIG_MOD = "_orig_mod"
_ORIGINAL_FORWARD = "_original_forward"
_HOOK = "_hf_hook"
_HOOKED_FORWARD = "_old_forward"
_HOOK_WRAPPER = "add_hook_to_module.<locals>.new_forward"


def set_orig_mod(module: Any, original: Any) -> None:
    """Record ``original`` as the module ``module`` compiles, as Accelerate's
    ``compile_regions`` does (in ``module.__dict__``: not a submodule, never in ``state_dict()``
    or ``children()``).

    Writes ``module.__dict__["_orig_mod"]``, which Accelerate's ``extract_model_from_parallel``
    reads to unwrap a regionally compiled model; Accelerate has no public way to declare it.
    Verified: torch 2.11, 2.13, 2.14, 2.15 (Accelerate 1.15).
    """
    module.__dict__[_ORIG_MOD] = original


def has_orig_mod(module: Any) -> bool:
    """Whether ``module`` carries Accelerate's ``_orig_mod`` record in its ``__dict__`` (see
    :func:`set_orig_mod`; a ``torch.compile`` wrapper's attribute of that name does not count).
    Verified: torch 2.11, 2.13, 2.14, 2.15 (Accelerate 1.15).
    """
    return _ORIG_MOD in getattr(module, "__dict__", {})


def drop_orig_mod(module: Any) -> None:
    """Remove ``module``'s ``_orig_mod`` record (see :func:`set_orig_mod`); none, no change.
    Verified: torch 2.11, 2.13, 2.14, 2.15 (Accelerate 1.15).
    """
    module.__dict__.pop(_ORIG_MOD, None)


def has_fp32_wrapper(module: Any) -> bool:
    """Whether ``Accelerator.prepare`` wrapped ``module``'s forward in autocast (mixed
    precision) and kept the forward it wrapped.

    Reads ``module.__dict__["_original_forward"]``, set by ``prepare`` and read by
    ``extract_model_from_parallel(keep_fp32_wrapper=False)``; Accelerate has no public query.
    Verified: torch 2.11, 2.13, 2.14, 2.15 (Accelerate 1.15).
    """
    return _ORIGINAL_FORWARD in module.__dict__


def fp32_wrapped_forward(module: Any, default: Any) -> Any:
    """The forward ``Accelerator.prepare`` wrapped in autocast on ``module``, else ``default``
    (see :func:`has_fp32_wrapper`). Verified: torch 2.11, 2.13, 2.14, 2.15 (Accelerate 1.15).
    """
    return module.__dict__.get(_ORIGINAL_FORWARD, default)


def drop_fp32_wrapper_record(module: Any) -> None:
    """Remove ``module``'s record of the forward ``Accelerator.prepare`` wrapped (see
    :func:`has_fp32_wrapper`), as ``extract_model_from_parallel`` does when it takes the
    wrapper off; none, no change. Verified: torch 2.11, 2.13, 2.14, 2.15 (Accelerate 1.15).
    """
    module.__dict__.pop(_ORIGINAL_FORWARD, None)


def hook_of(module: Any) -> Any | None:
    """The ``ModelHook`` Accelerate's ``add_hook_to_module`` put on ``module`` (``dispatch_model``,
    ``cpu_offload``, a ``device_map``), when the module's forward is still the hook's wrapper;
    else ``None``.

    Reads ``module._hf_hook`` and recognises the wrapper (a ``functools.partial`` of
    ``add_hook_to_module``'s local ``new_forward``, stored as the instance's ``forward``):
    Accelerate has no public query for either. Verified: torch 2.11, 2.13, 2.14, 2.15
    (Accelerate 1.15).
    """
    own = getattr(module, "__dict__", {})
    forward = own.get("forward")
    if not isinstance(forward, functools.partial) or _HOOK not in own:
        return None
    if getattr(forward.func, "__qualname__", "") != _HOOK_WRAPPER:
        return None
    return own[_HOOK]


def attached_hook(module: Any) -> Any | None:
    """``module``'s Accelerate hook (``_hf_hook``) whatever its forward is now, else ``None``:
    the hook torchkiln runs around a compiled call after taking the wrapper off (see
    :func:`hook_of`). Verified: torch 2.11, 2.13, 2.14, 2.15 (Accelerate 1.15).
    """
    return getattr(module, "__dict__", {}).get(_HOOK)


def forward_under_hook(module: Any) -> Any | None:
    """The forward Accelerate's hook wrapper calls (``module._old_forward``), else ``None``.
    Verified: torch 2.11, 2.13, 2.14, 2.15 (Accelerate 1.15).
    """
    return getattr(module, "__dict__", {}).get(_HOOKED_FORWARD)
