"""Built-in plugin: read Hugging Face Accelerate's dynamo settings into ``CompileConfig``.

Sources, lowest first (each higher one wins field by field):

1. an ``accelerate config`` YAML file, only when ``TORCHKILN_ACCELERATE_CONFIG`` names it
   (``TORCHKILN_ACCELERATE_CONFIG=default`` means Accelerate's own default file,
   ``$HF_HOME/accelerate/default_config.yaml``); it is never read behind the user's back;
2. the ``ACCELERATE_DYNAMO_*`` environment variables (``accelerate launch`` sets them from
   that same file and its own flags).

Both sit below everything torchkiln's own: this plugin only sets fields whose source is
``default``, so torchkiln's YAML, ``TORCHKILN_*`` variables and keyword options win.
Turn the plugin off with ``TORCHKILN_DISABLED_PLUGINS=torchkiln.accelerate_config``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchkiln.plugin import hookimpl

CONFIG_ENV = "TORCHKILN_ACCELERATE_CONFIG"
"""Names the Accelerate config file to read, or ``default`` for Accelerate's default one."""


def accelerate_config_file() -> Path | None:
    """The file ``TORCHKILN_ACCELERATE_CONFIG`` points at, or ``None`` when unset; ``default``
    is where ``accelerate config`` writes its default file (``HF_HOME``, then XDG cache)."""
    value = os.environ.get(CONFIG_ENV, "").strip()
    if not value:
        return None
    if value.lower() != "default":
        return Path(os.path.expanduser(value))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    hf_home = os.environ.get("HF_HOME") or os.path.join(cache, "huggingface")
    return Path(os.path.expanduser(hf_home)) / "accelerate" / "default_config.yaml"


@hookimpl
def resolve_compile_config(sources: Mapping[str, str]) -> Mapping[str, Any] | None:
    from torchkiln.compat.accelerate_settings import (
        AccelerateDynamo,
        read_env,
        read_yaml,
        to_overrides,
    )

    # The pointed-at file, then the environment over it.
    path = accelerate_config_file()
    settings = read_env().merged_over(read_yaml(path) if path is not None else AccelerateDynamo())
    if settings.is_empty:
        return None
    overrides = to_overrides(settings, sources)
    if overrides.get("backend") == "no":
        warnings.warn(
            f"torchkiln: compilation is off because {settings.origins['backend']} says NO "
            "(accelerate launch sets ACCELERATE_DYNAMO_BACKEND=NO when dynamo is not "
            "configured); pass backend= or set TORCHKILN_BACKEND to compile anyway",
            UserWarning,
            stacklevel=2,
        )
    return overrides or None
