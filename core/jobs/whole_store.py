"""Whole-model forms in a store (``store=DIR``): ``DIR/whole/<key>/``, one artifact directory
per model key, written aside by the builder and published with one rename (first writer wins,
a published form is never changed), found by the next process that names the store."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from torch import nn

from torchkiln.artifacts.directory import class_name, code_hash, environment_key, structure_hash
from torchkiln.configuration.config import CompileConfig
from torchkiln.configuration.store_layout import WHOLE
from torchkiln.jobs.store import JobStore


def whole_key(config: CompileConfig, model: nn.Module, region_paths: list[str]) -> str:
    """What a whole-model form is keyed by: the environment the manifest checks (torch,
    backend, mode, options, device, dtype), the model's class, sources, parameters and
    regions. Another model or setting gets its own directory, never a rejected one."""
    fields = {
        "environment": environment_key(config, model),
        "class": class_name(model),
        "code": code_hash(model),
        "structure": structure_hash(model),
        "regions": list(region_paths),
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def whole_store(config: CompileConfig) -> JobStore | None:
    """The store's section of whole-model forms (``None`` without a store)."""
    if config.store is None:
        return None
    return whole_section(config.store)


def whole_section(root: str | Path, writable: bool = True) -> JobStore:
    """The whole-model forms of the store (or precompiled directory) ``root``."""
    return JobStore(Path(root).expanduser(), section=WHOLE, writable=writable)


class BuildOutput:
    """Where the builder writes the whole-model form: aside in the store (published once
    built), else a private temporary directory (a precompiled directory is never written). One
    per runtime: a restarted builder writes where the first one did, until a form is published;
    a later rebuild then writes to a directory of its own, so a published form never changes."""

    def __init__(self, config: CompileConfig, region_paths: list[str]):
        self.config = config
        self.region_paths = region_paths
        self.path: Path | None = None
        """The directory torchkiln made (removed at the end unless a form was loaded)."""
        self.key: str | None = None
        """The store key :attr:`path` is published under, until it is."""

    def directory(self, model: nn.Module, form_loaded: bool) -> Path:
        if self.path is not None:
            return self.path
        store = whole_store(self.config) if not form_loaded else None
        if store is not None:
            self.key = whole_key(self.config, model, self.region_paths)
            self.path = store.staging(self.key)
        else:
            self.path = Path(tempfile.mkdtemp(prefix="torchkiln-whole-"))
        return self.path

    def publish(self, directory: Path) -> Path:
        """The directory to load the built form from: the store's published entry (another
        writer's, when it was first), or ``directory`` as it is."""
        store = whole_store(self.config)
        if self.key is None or store is None or directory != self.path:
            return directory
        published = store.publish(directory, self.key)
        self.key, self.path = None, None
        return published

    def remove(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
