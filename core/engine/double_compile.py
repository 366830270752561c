"""Detect a second compile (``torch.compile(model)``, ``model.compile()``, Accelerate's
``prepare``) of a model torchkiln already compiled: it inlines torchkiln's regions and puts
``_orig_mod.`` into checkpoint keys, silently. Each group function and first-call step starts
with ``comptime(check)``, which runs only while Dynamo traces it; :func:`report` then warns,
raises or stays silent, by ``TORCHKILN_ON_DOUBLE_COMPILE`` (docs/double-compile.md).
"""

from __future__ import annotations

import os
import sys
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
"""The advice while ``torchkiln.compat.accelerate.install()`` is not in effect."""

FIX_INSTALLED = (
    "Compile once: drop the outer compile (torch.compile(model) / model.compile()), or, under "
    "Accelerate, pass Accelerator(dynamo_backend='no') or use its regional compilation "
    "(TorchDynamoPlugin(use_regional_compilation=True)): torchkiln.compat.accelerate.install() "
    "is in effect, and it makes Accelerate's regional compile torchkiln's, not its whole-model "
    "torch.compile (or call torchkiln.decompile(model) first to let the other compile have it)."
)
"""The advice while ``install()`` is in effect: calling it again would change nothing."""

FIX_LEFT_INSTALLED = (
    "Compile once: torchkiln.compat.accelerate.install() is in effect, so Accelerate's regional "
    "compile (prepare) is torchkiln's: keep one of the two compiles (drop the earlier one, or "
    "pass Accelerator(dynamo_backend='no') to keep it), or call torchkiln.decompile(model) first "
    "to compile it again with these options."
)
"""The advice when torchkiln's ``compile_regions`` met the model while ``install()`` is in
effect (Accelerate's ``prepare`` calls it)."""

FIX_LEFT = (
    "Compile once: keep one of the two compiles, or call torchkiln.decompile(model) first to "
    "compile it again with these options."
)
"""The advice when ``torchkiln.compat.accelerate.compile_regions``, called directly, met it."""


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


def accelerate_install_in_effect() -> bool:
    """Whether ``torchkiln.compat.accelerate.install()`` is in effect now."""
    # Looked up, not imported: the engine sits below torchkiln.compat, and install() cannot be
    # in effect in a process that never imported its module.
    module = sys.modules.get("torchkiln.compat.accelerate_install")
    return bool(module is not None and module.is_installed())


def advice(left_as_is: bool = False) -> str:
    """How to compile once, for the state the process is in: whether ``install()`` is in
    effect, and whether the second compile was torchkiln's own ``compile_regions`` (which left
    the model as it is) or another compile that traces it."""
    installed = accelerate_install_in_effect()
    if left_as_is:
        return FIX_LEFT_INSTALLED if installed else FIX_LEFT
    return FIX_INSTALLED if installed else FIX


def report(what: str, stacklevel: int = 2, *, left_as_is: bool = False) -> None:
    """Warn, raise or do nothing (by :func:`policy`): ``what`` compiles a torchkiln-compiled
    model a second time, or (``left_as_is``) was asked to and left it as it is."""
    chosen = policy()
    if chosen == "off":
        return
    happened = (
        "was asked to compile a model torchkiln already compiled, with other options (a double "
        "compile; the model is left as it is)"
        if left_as_is
        else "is compiling a model torchkiln already compiled (a double compile)"
    )
    message = f"{what} {happened}. {advice(left_as_is)}"
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
        # Whether this frame was inlined into another one (public ComptimeContext methods
        # only: Dynamo's top frame has no parent, whose graph cannot be read).
        try:
            ctx.parent().graph()
        except AttributeError:
            return
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
