"""Detect a second compile of a model torchkiln already compiled.

``torch.compile(model)``, ``model.compile()`` or Accelerate's ``prepare`` (with a dynamo backend
configured) on a model torchkiln compiled makes Dynamo trace the whole model again, inlining
torchkiln's regions into one big graph: the regional cold start is lost, and checkpoints of the
returned ``OptimizedModule`` gain ``_orig_mod.`` keys. Nothing in torch warns about it.

How it is detected, without patching torch: this module is also the built-in plugin
``torchkiln.double_compile`` (``TORCHKILN_DISABLED_PLUGINS=torchkiln.double_compile`` turns the
detection off). Its ``prepare_group`` wraps every region group's traced function (``prepare_group`` -> ``wrap_traced``) so that it
starts with ``comptime(check)``. ``comptime`` runs ``check`` only while Dynamo *traces* the
function; compiled code does not contain it. When torchkiln compiles a region, the group's
function is Dynamo's top frame; when another compile traces the model, Dynamo inlines the
region's function into the outer frame, which ``check`` sees above the group function. It then warns (:class:`DoubleCompileWarning`, naming the fix)
or, with ``TORCHKILN_ON_DOUBLE_COMPILE=raise``, raises :class:`DoubleCompileError` (which
Dynamo reports inside its ``InternalTorchDynamoError``).

:func:`torchkiln.compat.accelerate.install` checks the same thing earlier, when Accelerate
asks to compile a model torchkiln already compiled, with the same policy.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

from torchkiln.errors import ConfigError, ConfigProblem, TorchkilnError
from torchkiln.group_preparation import GroupPreparation
from torchkiln.hooks import hookimpl
from torchkiln.region_plan import RegionGroup

ENV_POLICY = "TORCHKILN_ON_DOUBLE_COMPILE"
POLICIES = ("warn", "raise")

FIX = (
    "Compile once: drop the outer compile (torch.compile(model) / model.compile()), or, under "
    "Accelerate, pass Accelerator(dynamo_backend='no') or call "
    "torchkiln.compat.accelerate.install() so that Accelerate's regional compile is torchkiln's "
    "(or call torchkiln.decompile(model) first to let the other compile have it)."
)


class DoubleCompileWarning(UserWarning):
    """A model torchkiln compiled is being compiled a second time."""


class DoubleCompileError(TorchkilnError):
    """A model torchkiln compiled is being compiled a second time (policy ``raise``)."""


def policy(env: Any = None) -> str:
    """``warn`` (the default) or ``raise``, from ``TORCHKILN_ON_DOUBLE_COMPILE``.

    :raises ConfigError: for any other value, naming the variable and the allowed values.
    """
    environ = os.environ if env is None else env
    raw = environ.get(ENV_POLICY, "").strip().lower()
    if not raw:
        return "warn"
    if raw not in POLICIES:
        raise ConfigError(
            [
                ConfigProblem(
                    f"${ENV_POLICY}",
                    f"{raw!r} is not a double-compile policy; allowed: {', '.join(POLICIES)}",
                    f"env:{ENV_POLICY}",
                )
            ]
        )
    return raw


def report(what: str, stacklevel: int = 2) -> None:
    """Warn or raise (by :func:`policy`) that ``what`` compiles a torchkiln-compiled model."""
    message = f"{what} is compiling a model torchkiln already compiled (a double compile). {FIX}"
    if policy() == "raise":
        raise DoubleCompileError(f"{message} ({ENV_POLICY}=raise)")
    warnings.warn(
        f"{message} Set {ENV_POLICY}=raise to make this an error.",
        DoubleCompileWarning,
        stacklevel=stacklevel + 1,
    )


@hookimpl
def prepare_group(group: RegionGroup) -> GroupPreparation:
    """Every region group's traced function starts with the double-compile check."""
    return GroupPreparation(wrap_traced=traced_check(group.name))


def traced_check(group: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A ``GroupPreparation.wrap_traced`` for region group ``group``: the wrapped function
    first runs ``comptime(check)``, which only does anything while Dynamo traces it (compiled
    code does not contain it; see the module docstring)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        from torch._dynamo.comptime import comptime  # with Dynamo, never with torchkiln

        check = _comptime_check(group)

        def checked(module: Any, *args: Any, **kwargs: Any) -> Any:
            comptime(check)
            return fn(module, *args, **kwargs)

        return checked

    return wrap


def _comptime_check(group: str) -> Callable[[Any], None]:
    def check(ctx: Any) -> None:
        if inlined_into_another_frame(ctx):
            report(
                "another torch.compile (torch.compile(model), model.compile() or Accelerate's "
                f"dynamo backend) tracing into torchkiln's compiled region group {group!r}",
                stacklevel=2,
            )

    return check


def inlined_into_another_frame(ctx: Any) -> bool:
    """Whether the region's group function (the outermost frame of torchkiln's region compiler
    in Dynamo's frame chain) has a frame above it: then Dynamo is tracing something else that
    calls the region, not compiling the region itself.

    ``ComptimeContext`` has no public way to read a frame's code, so this reads its translator;
    if a future torch renames it, the check stays silent rather than break compiling.
    """
    from torchkiln import region_compiler

    tx = getattr(ctx, "_ComptimeContext__tx", None)
    group_frame = None
    while tx is not None:
        code = getattr(tx, "f_code", None)
        if code is not None and code.co_filename == region_compiler.__file__:
            group_frame = tx
        tx = getattr(tx, "parent", None)
    return group_frame is not None and getattr(group_frame, "parent", None) is not None


__all__ = [
    "ENV_POLICY",
    "POLICIES",
    "DoubleCompileError",
    "DoubleCompileWarning",
    "inlined_into_another_frame",
    "policy",
    "prepare_group",
    "report",
    "traced_check",
]
