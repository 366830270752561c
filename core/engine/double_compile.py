"""Detect a second compile (``torch.compile(model)``, ``model.compile()``, Accelerate's
``prepare``) of a model torchkiln already compiled: it inlines torchkiln's regions and puts
``_orig_mod.`` into checkpoint keys, silently. Each group function and first-call step starts
with ``comptime(check)``, which runs only while Dynamo traces it; :func:`report` then warns,
raises or stays silent, by ``TORCHKILN_ON_DOUBLE_COMPILE`` (docs/double-compile.md).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

from torchkiln.errors import ConfigError, ConfigProblem, TorchkilnError

ENV_POLICY = "TORCHKILN_ON_DOUBLE_COMPILE"
POLICIES = ("warn", "raise", "off")

FIX = (
    "Compile once: drop the outer compile (torch.compile(model) / model.compile()), or, under "
    "Accelerate, pass Accelerator(dynamo_backend='no') or call "
    "torchkiln.compat.accelerate.install() so that Accelerate's regional compile is torchkiln's "
    "(or call torchkiln.decompile(model) first to let the other compile have it)."
)

OUTER_COMPILE = (
    "another torch.compile (torch.compile(model), model.compile() or Accelerate's dynamo backend)"
)


class DoubleCompileWarning(UserWarning):
    """A model torchkiln compiled is being compiled a second time."""


class DoubleCompileError(TorchkilnError):
    """A model torchkiln compiled is being compiled a second time (policy ``raise``)."""


def policy() -> str:
    """``warn`` (the default), ``raise`` or ``off``, from ``TORCHKILN_ON_DOUBLE_COMPILE``.

    :raises ConfigError: for any other value, naming the variable and the allowed values.
    """
    raw = os.environ.get(ENV_POLICY, "").strip().lower()
    if not raw:
        return "warn"
    if raw not in POLICIES:
        problem = f"{raw!r} is not a double-compile policy; allowed: {', '.join(POLICIES)}"
        raise ConfigError([ConfigProblem(f"${ENV_POLICY}", problem, f"env:{ENV_POLICY}")])
    return raw


def report(what: str, stacklevel: int = 2) -> None:
    """Warn, raise or do nothing (by :func:`policy`): ``what`` compiles a torchkiln-compiled
    model a second time."""
    chosen = policy()
    if chosen == "off":
        return
    message = f"{what} is compiling a model torchkiln already compiled (a double compile). {FIX}"
    if chosen == "raise":
        raise DoubleCompileError(f"{message} ({ENV_POLICY}=raise)")
    warnings.warn(
        f"{message} Set {ENV_POLICY}=raise to make this an error, or =off to allow it.",
        DoubleCompileWarning,
        stacklevel=stacklevel + 1,
    )


def group_function_check(group: str) -> Callable[[Any], None]:
    """The ``comptime`` callback at the top of region group ``group``'s compiled function:
    reports when the function is not Dynamo's top frame (another compile inlined it)."""

    def check(ctx: Any) -> None:
        if has_parent_frame(ctx):
            report(f"{OUTER_COMPILE} tracing into torchkiln's compiled region group {group!r}")

    return check


def first_call_check(group: str) -> Callable[[Any], None]:
    """The ``comptime`` callback at the top of a region's first-call shim: any trace of it is
    another compile's (torchkiln runs the shim eagerly)."""

    def check(ctx: Any) -> None:
        report(
            f"{OUTER_COMPILE} tracing into torchkiln's region group {group!r} before its first call"
        )

    return check


def has_parent_frame(ctx: Any) -> bool:
    """Whether the frame ``comptime`` runs in was inlined into another one. Public
    ``ComptimeContext`` methods only: Dynamo's top frame has no parent, whose graph cannot be
    read."""
    try:
        ctx.parent().graph()
    except AttributeError:
        return False
    return True
