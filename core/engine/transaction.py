"""All or nothing: what ``torchkiln.compile`` puts back when it fails after touching the model.

:meth:`Snapshot.take` runs after everything that can be checked without touching the model was
checked (configuration, the plan, hook results). It records, for every module, its class and
the keys and values of its ``__dict__`` (the dicts in it, parameters, buffers, submodules and
hooks, by content), and the process-wide state a plugin may change: the environment and
``torch._dynamo.config``. :meth:`Snapshot.restore` puts all of it back, so a compile that fails
in ``wrap_distributed``, in a ``compile_region`` or in a check after them leaves the same
``forward``, the same parameter objects, no extra attribute and the settings it found.

Parameter *values* are not copied (that would double the model's memory): torchkiln never
writes them, and a strategy that does (DDP broadcasts rank 0's weights) writes the same values
every rank already holds.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
from torch import nn

_EMPTY: dict[Any, Any] = {}


@attrs.define(eq=False)
class _ModuleSnapshot:
    module: nn.Module
    cls: type
    attributes: dict[str, Any]
    contents: dict[str, dict[Any, Any]]
    """Each dict-valued attribute (``_parameters``, ``_modules``, hook dicts), copied."""

    @classmethod
    def take(cls, module: nn.Module) -> _ModuleSnapshot:
        attributes = dict(module.__dict__)
        # Most of a module's dicts (hooks) are empty: share one empty copy for them.
        contents = {
            key: dict(value) if value else _EMPTY
            for key, value in attributes.items()
            if isinstance(value, dict)
        }
        return cls(module, type(module), attributes, contents)

    def restore(self) -> None:
        module = self.module
        if type(module) is not self.cls:
            object.__setattr__(module, "__class__", self.cls)  # FSDP2 swaps in a subclass
        current = module.__dict__
        for key in [key for key in current if key not in self.attributes]:
            del current[key]
        for key, value in self.attributes.items():
            saved = self.contents.get(key)
            if saved is not None and _changed(value, saved):
                value.clear()
                value.update(saved)
            current[key] = value


def _changed(now: dict[Any, Any], saved: dict[Any, Any]) -> bool:
    return now.keys() != saved.keys() or any(now[k] is not v for k, v in saved.items())


def _dynamo_config() -> Any:
    import torch._dynamo.config as dynamo_config

    return dynamo_config


@attrs.define(eq=False)
class Snapshot:
    """The model and the process-wide state before ``torchkiln.compile`` touched anything."""

    modules: list[_ModuleSnapshot]
    environment: dict[str, str]
    dynamo: dict[str, Any]

    @classmethod
    def take(cls, model: nn.Module) -> Snapshot:
        return cls(
            [_ModuleSnapshot.take(module) for module in model.modules()],
            dict(os.environ),
            _dynamo_config().get_config_copy(),
        )

    def restore(self) -> None:
        """Put everything back (modules first, then settings)."""
        for snapshot in self.modules:
            snapshot.restore()
        self._restore_environment()
        self._restore_dynamo()

    def _restore_environment(self) -> None:
        for key in [key for key in os.environ if key not in self.environment]:
            del os.environ[key]
        for key, value in self.environment.items():
            if os.environ.get(key) != value:
                os.environ[key] = value

    def _restore_dynamo(self) -> None:
        config = _dynamo_config()
        now = config.get_config_copy()
        for key, value in self.dynamo.items():
            if now.get(key, value) is not value and now.get(key) != value:
                setattr(config, key, value)
