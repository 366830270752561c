"""Detect a second compile of a model torchkiln already compiled.

``torch.compile(model)``, ``model.compile()`` or Accelerate's ``prepare`` (with a dynamo backend
configured) on a model torchkiln compiled makes Dynamo trace the whole model again, inlining
torchkiln's regions into one big graph: the regional cold start is lost, and checkpoints of the
returned ``OptimizedModule`` gain ``_orig_mod.`` keys. Nothing in torch warns about it.

How it is detected, without patching torch: the function torchkiln compiles for each region
group starts with ``comptime(check)``. ``comptime`` runs ``check`` only while Dynamo *traces*
the function (at run time it is a no-op call, and compiled code does not contain it at all).
When torchkiln's own compile traces the function it is Dynamo's top frame; when another
compile traces the model, Dynamo inlines the region's function into the outer frame, which
``check`` sees as a parent frame. It then warns (:class:`DoubleCompileWarning`, naming the fix)
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


def outer_trace_check(group: str) -> Callable[[Any], None]:
    """The ``comptime`` callback for one region group's compiled function (see the module
    docstring). Uses only ``ComptimeContext``'s public methods: ``parent()`` of Dynamo's top
    frame has no graph."""

    def check(ctx: Any) -> None:
        try:
            ctx.parent().graph()
        except AttributeError:  # top frame: torchkiln's own compile of this region
            return
        report(
            f"another torch.compile (torch.compile(model), model.compile() or Accelerate's "
            f"dynamo backend) tracing into torchkiln's compiled region group {group!r}",
            stacklevel=2,
        )

    return check


__all__ = [
    "ENV_POLICY",
    "POLICIES",
    "DoubleCompileError",
    "DoubleCompileWarning",
    "outer_trace_check",
    "policy",
    "report",
]
