"""Dynamo's private state that torchkiln reads or sets (``torch._dynamo``, ``torch._C._dynamo``).

Every function imports ``torch._dynamo`` in its body: importing this module imports no torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

STATIC_ADDRESS_TAG = "_dynamo_static_input_type"
"""The tensor attribute Dynamo sets on the parameters and buffers it sees (and
``torch._dynamo.mark_static_address`` sets), read by :func:`has_static_address_tag`."""


def eval_frame_stance() -> Any:
    """The stance ``torch.compiler.set_stance`` set last: an object with ``stance`` (``"default"``,
    ``"force_eager"``, ...) and ``skip_guard_eval_unsafe``.

    Reads ``torch._dynamo.eval_frame._stance``, rebound by every ``set_stance``, so read it per
    call. torch has no public getter for the stance in force. Verified: torch 2.11, 2.13, 2.14,
    2.15.
    """
    import torch._dynamo.eval_frame as eval_frame

    return eval_frame._stance


def stance_name() -> str:
    """The name of the stance in force (``"default"`` where this torch keeps none).

    Reads :func:`eval_frame_stance` and its ``stance``; a torch without either (an
    ``AttributeError``) answers ``"default"``. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    try:
        return str(eval_frame_stance().stance)
    except AttributeError:
        return "default"


def optimized_module_type() -> type:
    """The class of what ``torch.compile(module)`` returns (``OptimizedModule``).

    Reads ``torch._dynamo.eval_frame.OptimizedModule``: torch exports no public name for the
    wrapper class, and ``isinstance`` against it is how torch, Accelerate and transformers
    recognise a compiled module. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    import torch._dynamo.eval_frame as eval_frame

    return eval_frame.OptimizedModule


def original_module(optimized: Any) -> Any:
    """The module a ``torch.compile`` wrapper (an :func:`optimized_module_type`) wraps.

    Reads ``OptimizedModule._orig_mod``: the wrapper has no public accessor for it (torch's own
    ``state_dict`` keys carry the ``_orig_mod.`` prefix). Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    return optimized._orig_mod


def rewrapped(plain: Any, optimized: Any) -> Any:
    """A new ``torch.compile`` wrapper of ``plain`` with the compile settings of ``optimized``.

    Calls ``torch._dynamo.eval_frame.OptimizedModule(plain, optimized.dynamo_ctx)``: a new
    ``torch.compile(plain, ...)`` would need the original arguments, which the wrapper keeps
    only as its Dynamo context. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    return optimized_module_type()(plain, optimized.dynamo_ctx)


def without_wrapper_keys(key: str) -> str:
    """``key`` of a ``state_dict()`` without the ``_orig_mod.`` segments a ``torch.compile``
    wrapper (an :func:`optimized_module_type`) adds to the keys of what it wraps.

    The segment is the name of ``OptimizedModule._orig_mod`` (see :func:`original_module`);
    torch offers no public way to strip it. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    return ".".join(part for part in key.split(".") if part != "_orig_mod")


def lookup_backend(name: str) -> Callable[..., Any]:
    """The backend function torch registered as ``name`` (entry-point backends included).

    Calls ``torch._dynamo.lookup_backend``: ``torch.compiler`` lists backends
    (``list_backends``) but does not hand one out. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    import torch._dynamo

    return torch._dynamo.lookup_backend(name)


def counters() -> Any:
    """Dynamo's process-wide counters (``counters["stats"]["unique_graphs"]``,
    ``counters["graph_break"]``, ``counters["inductor"]``...): a dict of ``Counter``\\ s.

    Reads ``torch._dynamo.utils.counters``, the only place torch counts graphs, graph breaks
    and cache hits; no public API exposes them. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    import torch._dynamo.utils as dynamo_utils

    return dynamo_utils.counters


def compilation_metrics() -> list[Any]:
    """The compilation records Dynamo still keeps (the most recent ones), oldest first.

    Calls ``torch._dynamo.utils.get_compilation_metrics()``: per-frame compile times, recompile
    and failure reasons and cache hits are only there (structured logs aside). Verified: torch
    2.11, 2.13, 2.14, 2.15.
    """
    import torch._dynamo.utils as dynamo_utils

    return list(dynamo_utils.get_compilation_metrics())


def exception_type() -> type[BaseException]:
    """The base class of the errors Dynamo raises while it compiles.

    Reads ``torch._dynamo.exc.TorchDynamoException``: torch has no public base class for
    compile errors (``torch.compiler`` names none). Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    import torch._dynamo.exc as dynamo_exc

    return dynamo_exc.TorchDynamoException


def config() -> Any:
    """Dynamo's settings module, ``torch._dynamo.config`` (``get_config_copy()``, ``patch``,
    the settings as attributes).

    Dynamo's settings (``allow_unspec_int_on_nn_module``, the recompile limit, ...) are only
    there; ``torch.compiler.config`` holds other ones. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    import torch._dynamo.config as dynamo_config

    return dynamo_config


def config_patch(**changes: Any) -> contextlib.AbstractContextManager[Any]:
    """A context manager that sets Dynamo's ``changes`` and restores them on exit (outside a
    traced function).

    Calls ``torch._dynamo.config.patch``; see :func:`config`. Verified: torch 2.11, 2.13, 2.14,
    2.15.
    """
    return config().patch(**changes)


def floats_specialized() -> contextlib.AbstractContextManager[Any]:
    """While in force, Dynamo traces Python floats as constants (``specialize_float``).

    ``aot_compile`` with symbolic sizes may need Dynamo to restart its analysis with floats
    specialized (``TensorifyScalarRestartAnalysis``); a normal compile does that restart itself,
    ``aot_compile`` lets the exception escape (torch 2.13, 2.15). With floats specialized from
    the start there is nothing to restart: a float that changes is then guarded on, as torch's
    own default was before 2.6. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    return config_patch(specialize_float=True)


def traced_config_patcher() -> Callable[..., Any]:
    """``torch._dynamo.patch_dynamo_config``: called *inside* a function Dynamo traces
    (``with patcher(allow_unspec_int_on_nn_module=True): ...``), it sets the settings for every
    trace of that function, recompiles included, and changes no process-wide state.

    Fetch it outside the traced function and call it inside: Dynamo recognises the function by
    identity. No public API sets Dynamo settings per traced function. A torch without it raises
    ``AttributeError`` here; one without a setting raises ``ValueError`` when the patcher is
    called with it (callers probe both). Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    import torch._dynamo

    return torch._dynamo.patch_dynamo_config


def comptime_function() -> Callable[..., Any]:
    """``torch._dynamo.comptime.comptime``: ``comptime(fn)`` inside a traced function runs
    ``fn`` while Dynamo traces it (nothing of it in the graph, no graph break);
    ``comptime(fn, fallback)`` run eagerly calls ``fallback()``.

    Fetch it outside the traced function where possible (Dynamo recognises it by identity).
    No public API runs code at trace time only. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    from torch._dynamo.comptime import comptime

    return comptime


def has_static_address_tag(tensor: Any) -> bool:
    """Whether Dynamo has tagged ``tensor`` (a parameter or buffer it traced, or one the user
    passed to ``torch._dynamo.mark_static_address``).

    Reads the tensor's ``_dynamo_static_input_type`` (:data:`STATIC_ADDRESS_TAG`) in its
    ``__dict__``: torch has no public query for the tag. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    return STATIC_ADDRESS_TAG in tensor.__dict__


def drop_static_address_tag(tensor: Any) -> None:
    """Remove Dynamo's tag from ``tensor`` (see :func:`has_static_address_tag`); no tag, no
    change. torch has no public way to undo the tag. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    tensor.__dict__.pop(STATIC_ADDRESS_TAG, None)


RECOMPILE_REFUSED = "Detected recompile when torch.compile stance is 'fail_on_recompile'"
"""How torch's ``fail_on_recompile`` stance words its refusal (a plain ``RuntimeError``)."""


def recompile_refusal(error: BaseException) -> list[str] | None:
    """The guard failures named by Dynamo's refusal to compile under the ``fail_on_recompile``
    stance (``torch.compiler.set_stance``), ``[]`` when it names none; ``None`` when ``error``
    is not that refusal.

    Dynamo raises a plain ``RuntimeError`` (``torch._dynamo.convert_frame``), with no type or
    attribute of its own: only its wording tells it from any other ``RuntimeError``, and the
    guard failures are only in its text (``- 0/0: tensor 'x' rank mismatch ...``).
    Verified: torch 2.11, 2.13, 2.14, 2.15 (tests/internals/test_dynamo_contracts.py).
    """
    text = str(error)
    if not isinstance(error, RuntimeError) or not text.startswith(RECOMPILE_REFUSED):
        return None
    return [
        line.strip()[2:].split(": ", 1)[-1]
        for line in text.splitlines()
        if line.strip().startswith("- ")
    ]
