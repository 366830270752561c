"""Exceptions raised by torchkiln.

Every error a user can cause derives from :class:`TorchkilnError`, so one ``except`` catches
them all; each subclass names one concern.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs


@attrs.frozen
class ConfigProblem:
    """One bad value: where it is, what it was, what is allowed."""

    path: str
    """JSONPath-like field path (``$.distributed.strategy``)."""
    message: str
    """What is wrong and what is allowed."""
    source: str = ""
    """Where the value came from: ``default``, ``file:PATH``, ``env:NAME``, ``argument``,
    ``plugin:NAME``."""

    def __str__(self) -> str:
        where = f" (from {self.source})" if self.source and self.source != "default" else ""
        return f"{self.path}{where}: {self.message}"


class TorchkilnError(Exception):
    """Base class of every torchkiln error."""


class ConfigError(TorchkilnError, ValueError):
    """Bad configuration from a YAML file, the environment, keyword options or a plugin.

    Lists every problem found, each with its field path, the bad value and what is allowed.
    """

    def __init__(self, problems: Sequence[ConfigProblem] | str):
        if isinstance(problems, str):
            problems = [ConfigProblem(path="$", message=problems)]
        self.problems: tuple[ConfigProblem, ...] = tuple(problems)
        count = len(self.problems)
        head = f"invalid torchkiln configuration ({count} problem{'s' if count != 1 else ''}):"
        super().__init__("\n".join([head, *(f"  {p}" for p in self.problems)]))


class PluginError(TorchkilnError):
    """A plugin failed to load, declared something invalid, or raised inside a hook.

    ``plugin`` and ``hook`` name the plugin at fault when torchkiln knows them.
    """

    def __init__(self, message: str, *, plugin: str | None = None, hook: str | None = None):
        super().__init__(message)
        self.plugin = plugin
        self.hook = hook


class RegionCompileError(TorchkilnError):
    """A region failed to compile under the ``raise`` region error policy."""

    def __init__(self, path: str, group: str, error: BaseException, plugin: str | None = None):
        self.path = path
        self.group = group
        self.error = error
        self.plugin = plugin
        by = f" in compile_region of plugin {plugin!r}" if plugin else ""
        super().__init__(
            f"compiling region {path or '<root>'!r} (group {group!r}) failed{by}: "
            f"{type(error).__name__}: {error}. Set on_region_error='eager' to run failing "
            "regions eagerly instead."
        )


class UncoveredCallError(TorchkilnError):
    """A call of a frozen model (``torchkiln.freeze(model, on_miss="raise")``) that no compiled
    form it holds fits: serving it would compile.

    ``where`` names the region (its path and group) and ``guards`` the guards that failed,
    in torch's words."""

    def __init__(self, where: str, guards: Sequence[str], hint: str = ""):
        self.where = where
        self.guards = tuple(guards)
        failed = "; ".join(self.guards) or "no compiled form was there to check"
        super().__init__(
            f"torchkiln: frozen model: no compiled form covers this call of {where}: {failed}. "
            "Warm this call up before torchkiln.freeze, or freeze with on_miss='eager' to run "
            f"such calls eagerly{hint}"
        )


class DistributedError(TorchkilnError):
    """A distributed strategy cannot run as configured (no process group, wrapped twice, ...)."""


class JobError(DistributedError):
    """The ranks of a job could not share a compile: a rank did not reach the same point, or
    did not send what it compiled, within ``job.timeout``; the message names the rank."""


class PartialCompileWarning(RuntimeWarning):
    """Part of a region's call runs outside its compiled code: a method run eagerly at a graph
    break on every call, or a nested block traced again at every call site. Outputs stay
    exact; the warning says what it costs and why, once per group and reason."""
