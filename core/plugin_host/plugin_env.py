"""The ``TORCHKILN_*`` plugin controls as the plugin manager reads them (flags, name lists),
and the hook-call trace ``TORCHKILN_TRACE_PLUGINS=1`` prints (see
:mod:`torchkiln.plugin_host.plugin_manager` for what each variable does).
"""

from __future__ import annotations

import difflib
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

_TRUE = frozenset({"1", "true", "yes", "on"})


def env_flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in _TRUE


def env_names(env: Mapping[str, str], name: str) -> set[str] | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def short(value: Any, limit: int = 200) -> str:
    text = " ".join(repr(value).split())  # one line per trace record, even for modules
    return text if len(text) <= limit else text[: limit - 3] + "..."


def trace_before(hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    args = ", ".join(f"{k}={short(v)}" for k, v in kwargs.items())
    plugins = ", ".join(impl.plugin_name for impl in reversed(impls))
    print(f"torchkiln: hook {hook_name}({args}) -> plugins [{plugins}]", file=sys.stderr)


def trace_after(
    outcome: Any, hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    exception = outcome.exception
    shown = f"raised {exception!r}" if exception is not None else short(outcome.get_result())
    print(f"torchkiln: hook {hook_name} returned {shown}", file=sys.stderr)


def warn_unknown_names(
    env: Mapping[str, str], external: Sequence[str], builtins: Sequence[str]
) -> None:
    """A ``RuntimeWarning`` for each name in ``TORCHKILN_PLUGINS`` / ``TORCHKILN_DISABLED_PLUGINS``
    that matches no built-in and no installed entry point, with the closest known name."""
    for variable, known in (
        ("TORCHKILN_PLUGINS", external),
        ("TORCHKILN_DISABLED_PLUGINS", [*builtins, *external]),
    ):
        lowered = {name.lower(): name for name in known}
        # "tensorrt" is close to "torchkiln.tensorrt": compare with the short names too.
        candidates = {**{n.removeprefix("torchkiln."): n for n in lowered}, **lowered}
        for name in sorted(env_names(env, variable) or ()):
            if name.lower() in lowered:
                continue
            close = difflib.get_close_matches(name.lower(), list(candidates), n=1)
            hint = f" (did you mean {lowered[candidates[close[0]]]!r}?)" if close else ""
            what = (
                "installed plugin (entry-point name)"
                if variable == "TORCHKILN_PLUGINS"
                else "plugin"
            )
            warnings.warn(
                f"{variable}: {name!r} matches no {what}{hint}; names are matched "
                f"case-insensitively; known: {', '.join(known) or 'none'}",
                RuntimeWarning,
                stacklevel=4,  # the caller of PluginManager.ensure_loaded
            )


def call_traced(hook_name: str, impl: Any, kwargs: Mapping[str, Any]) -> Any:
    """Call one implementation (a pluggy ``HookImpl``) with the ``kwargs`` it takes, printing
    the call and its result (or what it raised) as :func:`trace_before` / :func:`trace_after`
    print a ``pm.hook`` call."""
    args = ", ".join(f"{k}={short(v)}" for k, v in kwargs.items())
    where = f"{hook_name} [{impl.plugin_name}]"
    print(f"torchkiln: hook {hook_name}({args}) -> plugin {impl.plugin_name}", file=sys.stderr)
    try:
        result = impl.function(**{name: kwargs[name] for name in impl.argnames})
    except Exception as error:
        print(f"torchkiln: hook {where} raised {error!r}", file=sys.stderr)
        raise
    print(f"torchkiln: hook {where} returned {short(result)}", file=sys.stderr)
    return result
