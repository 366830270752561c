"""Integrations with training frameworks: Lightning (:mod:`torchkiln.integrations.lightning`) and
the Hugging Face ``Trainer`` (:mod:`torchkiln.integrations.transformers`), each imported only
when asked for (``import torchkiln`` imports neither framework).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchkiln.errors import ConfigError, ConfigProblem


def callback_options(framework: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``torchkiln.compile`` keyword options for a callback: the framework's own strategy
    wraps the model for DDP/FSDP, so torchkiln's ``distributed`` must stay ``none``.

    :raises ConfigError: for ``distributed`` other than ``none``, naming what to do instead.
    """
    distributed = options.get("distributed", "none")
    strategy = distributed.get("strategy") if isinstance(distributed, Mapping) else distributed
    if strategy not in (None, "none"):
        problem = (
            f"{strategy!r}: under {framework} the framework's own strategy wraps the model; the "
            "callback compiles the module in place inside it. Allowed: none (choose DDP/FSDP in "
            f"{framework}'s own settings)"
        )
        raise ConfigError([ConfigProblem("$.distributed", problem, "argument")])
    return {**options, "distributed": "none"}
