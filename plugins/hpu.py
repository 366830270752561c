"""Built-in plugin: Intel Gaudi, backend ``hpu``.

``import habana_frameworks.torch.core`` registers Gaudi's ``hpu_backend`` dynamo backend.
torch.compile on Gaudi runs only in eager mode (``PT_HPU_LAZY_MODE=0``, the default in recent
Gaudi releases); lazy mode (``PT_HPU_LAZY_MODE=1``) is Gaudi's older graph mode, which has no
torch.compile support. The variable is read once, when habana_frameworks is first imported,
so it has to be set before the process starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from torchkiln.plugin import (
    Availability,
    BackendSpec,
    CompileConfig,
    RegionGroup,
    compile_with_torch,
    hookimpl,
    probe_import,
)

CORE = "habana_frameworks.torch.core"
TORCH_BACKEND = "hpu_backend"
INSTALL_HINT = "install Intel Gaudi's PyTorch packages (https://docs.habana.ai, Installation Guide)"
LAZY_MODE_VAR = "PT_HPU_LAZY_MODE"


def _lazy_mode_active() -> bool:
    """What the loaded Gaudi bridge says, for releases where lazy mode is the default."""
    try:
        from habana_frameworks.torch.utils.internal import is_lazy

        return bool(is_lazy())
    except Exception:  # not installed (ImportError), or the bridge cannot say
        return False


def probe() -> Availability:
    value = os.environ.get(LAZY_MODE_VAR)
    if value is not None and value.strip() != "0":
        # Checked before importing: the import itself fixes the mode for the process.
        return Availability.no(
            f"{LAZY_MODE_VAR}={value!r} selects Gaudi's lazy mode, which has no torch.compile "
            f"support; start the process with {LAZY_MODE_VAR}=0 (eager mode + torch.compile)"
        )
    availability = probe_import(CORE, INSTALL_HINT)
    if availability.available and _lazy_mode_active():
        return Availability.no(
            f"Gaudi is running in lazy mode ({LAZY_MODE_VAR} unset defaults to 1 in this "
            f"release), which has no torch.compile support; start the process with "
            f"{LAZY_MODE_VAR}=0"
        )
    return availability


@hookimpl
def declare_backends() -> Sequence[BackendSpec]:
    # Gaudi documents no closed list of modes or options for hpu_backend: both pass through.
    return [
        BackendSpec(
            "hpu",
            "Intel Gaudi's hpu_backend (eager mode, PT_HPU_LAZY_MODE=0)",
            probe=probe,
            training=True,
            devices=("hpu",),
            compile=compile_group,
        )
    ]


def compile_group(
    fn: Callable[..., Any], group: RegionGroup, config: CompileConfig
) -> Callable[..., Any]:
    """The ``hpu`` backend's compile of one region group (``BackendSpec.compile``)."""
    __import__(CORE)  # registers hpu_backend with torch._dynamo
    return compile_with_torch(fn, config, TORCH_BACKEND)
