"""diffusers' private declarations that torchkiln reads (``ModelMixin._repeated_blocks``).

Nothing here imports diffusers.
"""

from __future__ import annotations

from typing import Any


def repeated_blocks(model: Any) -> Any:
    """The class names a diffusers model declares as its repeated blocks (``None`` where it
    declares none, or is not a diffusers model).

    Reads ``model._repeated_blocks``, the list ``ModelMixin.compile_repeated_blocks`` compiles;
    diffusers has no public accessor. Verified: torch 2.11, 2.13, 2.14, 2.15 (diffusers 0.42).
    """
    return getattr(model, "_repeated_blocks", None)
