"""Whole-model forms in a store (``store=DIR``): ``DIR/whole/<key>/``, one artifact directory
per model key, written aside by the builder and published with one rename (first writer wins,
a published form is never changed), found by the next process that names the store."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from torch import nn

from torchkiln.artifacts.directory import MANIFEST, code_hash, environment_key, structure_hash
from torchkiln.artifacts.whole_model import class_name
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
    return JobStore(Path(config.store).expanduser(), section=WHOLE, marker=MANIFEST)
