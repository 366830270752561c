"""``artifacts=DIR``: a directory ``torchkiln precompile`` wrote (a store), read and never written.

At compile time, per region group, every entry of the directory whose group fields
(:func:`~torchkiln.jobs.keys.group_fields`: torch, backend, options, device, dtype, the group's
class, sources and layout) are this group's is loaded, kernels first, each file checked against
its ``meta.json``; each call then runs the first loaded function whose saved guards pass
(:class:`~torchkiln.engine.group_runtime.GroupCode`). A group no entry fits warns once and
compiles normally, and so does a call no function fits; under ``artifacts_strict`` either is an
error. docs/precompile.md says what is checked and why.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchkiln.artifacts.directory import KINDS, MANIFEST, ArtifactError, read_meta
from torchkiln.artifacts.precompiled import ArtifactWarning
from torchkiln.configuration.config import CompileConfig
from torchkiln.engine.group_runtime import CodeSource, GroupCall
from torchkiln.engine.saved_code import SavedCode
from torchkiln.jobs.entry import load_entry
from torchkiln.jobs.keys import CALL_FIELDS, group_fields
from torchkiln.jobs.store import JobStore
from torchkiln.plugin_host.region_plan import RegionGroup

logger = logging.getLogger("torchkiln")

Entry = tuple[Path, dict[str, Any]]
NOT_MATCHED = (*CALL_FIELDS, "transformers", "architecture", "device_index")
"""Fields a precompiled directory's entries are not matched by: a directory is shipped to other
machines, so the saved guards (shapes, device index) and the CPU probe's record decide these,
call by call, as they did before entries were keyed by them."""


class PrecompiledDirectory(CodeSource):
    """Per compiled model: the directory's entries read once, groups loaded one by one."""

    def __init__(self, directory: str, strict: bool, config: CompileConfig, plugins: Any):
        self.directory = Path(directory).expanduser()
        self.name = f"artifacts {self.directory}"
        self.strict = strict
        self.config = config
        self.plugins = plugins
        self.loaded: dict[str, SavedCode] = {}
        self.load_seconds: dict[str, float] = {}
        """Group -> seconds its entries took to load (at compile time, before any call)."""
        self._entries: list[Entry] | None = None

    def _reject(self, what: str, reason: str) -> None:
        message = f"torchkiln: artifacts in {str(self.directory)!r} not used for {what}: {reason}"
        if self.strict:
            raise ArtifactError(message + " (artifacts_strict is set, so this is an error)")
        warnings.warn(message + "; compiling normally", ArtifactWarning, stacklevel=5)

    def entries(self) -> list[Entry]:
        """Every entry with its metadata, read once (none, after a warning, when the directory
        or the backend cannot serve)."""
        if self._entries is None:
            self._entries = []
            published = JobStore(self.directory, writable=False).published()
            problem = self._problem(published)
            if problem is not None:
                self._reject("any group", problem)
                return self._entries
            try:  # a shipped directory with a broken entry is damaged: none is used
                found = [(path, read_meta(path)) for path in published]
            except ArtifactError as error:
                self._reject("any group", str(error))
            else:
                self._entries = found
        return self._entries

    def _problem(self, published: list[Path]) -> str | None:
        declared = self.plugins.backend(self.config.backend)
        if declared is None or not getattr(declared.spec, "precompile", False):
            return (
                f"backend {self.config.backend!r} does not declare that it can load precompiled "
                "functions (BackendSpec.precompile)"
            )
        if (self.directory / MANIFEST).is_file():
            return (
                "it was written by an older torchkiln (manifest.json and groups/): re-run "
                "`torchkiln precompile` to rewrite it"
            )
        if not published:
            return (
                f"artifacts directory {str(self.directory)!r} holds no precompiled entries "
                "(write them with torchkiln.precompile or `torchkiln precompile`)"
            )
        return None

    def load(self, call: GroupCall) -> SavedCode | None:
        return self.loaded.get(call.group.name)

    def attach(self, group: RegionGroup, shared: Callable[..., Any]) -> bool:
        """Whether entries fit the group and loaded, else ``False`` after a warning (an error
        under ``strict``): the group compiles as usual."""
        entries = self.entries()
        if not entries:
            return False
        fields = _group_part(
            {"fields": group_fields(self.config, group.name, group.regions[0].module, shared)}
        )
        fitting = sorted(
            (e for e in entries if _group_part(e[1]) == fields),
            key=lambda e: (str(e[1].get("kind")) != KINDS[0], str(e[1]["fields"])),
        )
        reason = None if fitting else _why_none(fields, [meta for _, meta in entries])
        if reason is None:
            started = time.perf_counter()
            try:
                loaded = self._load(group.name, fitting, shared)
            except ArtifactError as error:  # refused by the integrity check: nothing was loaded
                reason = str(error)[:500]
            except Exception as error:
                reason = f"loading failed: {type(error).__name__}: {error}"[:500]
            else:
                self.loaded[group.name] = loaded
                self.load_seconds[group.name] = time.perf_counter() - started
                kinds = [kind for kind, _ in loaded.functions]
                logger.info(
                    "torchkiln: group %r loaded from %s (%d precompiled functions: %s)",
                    group.name,
                    self.directory,
                    len(kinds),
                    ", ".join(kinds),
                )
                return True
        self._reject(f"group {group.name!r}", reason)
        return False

    def _load(self, group: str, fitting: list[Entry], shared: Callable[..., Any]) -> SavedCode:
        functions: list[tuple[str, Any]] = []
        closure: dict[str, Any] = {}
        for path, _ in fitting:
            loaded, closure = load_entry(path, shared, self.config.cache_dir)
            functions += loaded
        return SavedCode(self.name, functions, closure, functools.partial(self._miss, group))

    def _miss(self, group: str, reason: str | None) -> None:
        """A call no loaded function fits: warned once (the backend compiles such calls), an
        error on every call under ``strict``."""
        if reason is None:
            if self.strict:
                raise ArtifactError(f"precompiled group {group!r} does not fit this call")
            return
        message = (
            f"torchkiln: precompiled group {group!r} does not fit this call ({reason}); "
            "compiling it normally for such calls"
        )
        if self.strict:
            raise ArtifactError(message + " (artifacts_strict is set, so this is an error)")
        warnings.warn(message, ArtifactWarning, stacklevel=5)


def _group_part(meta: dict[str, Any]) -> dict[str, Any]:
    fields = meta.get("fields")
    if not isinstance(fields, dict):
        return {}
    return {name: value for name, value in fields.items() if name not in NOT_MATCHED}


def _why_none(fields: dict[str, Any], metas: list[dict[str, Any]]) -> str:
    """Why no entry fits the group: the nearest entry of the same group, field by field."""
    same = [
        _group_part(meta) for meta in metas if _group_part(meta).get("group") == fields["group"]
    ]
    if not same:
        names = sorted({str(_group_part(meta).get("group")) for meta in metas})
        shown = ", ".join(repr(name) for name in names) or "none"
        return f"no precompiled entry for this group (groups in the directory: {shown})"
    nearest = min(same, key=lambda saved: sum(saved.get(k) != v for k, v in fields.items()))
    return "; ".join(
        _difference(name, nearest.get(name), value)
        for name, value in fields.items()
        if nearest.get(name) != value
    )


def _difference(name: str, saved: Any, now: Any) -> str:
    if name == "class":
        return f"the group's class is {now}, precompiled for {saved}"
    if name == "code":
        return (
            "the source of the group's classes changed since it was precompiled (code hash differs)"
        )
    if name == "structure":
        return "the group's parameters or buffers differ in names, shapes or dtypes"
    return f"{name}: precompiled with {saved!r}, now {now!r}"[:300]
