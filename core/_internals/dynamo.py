"""Dynamo's private state that torchkiln reads or sets (``torch._dynamo``, ``torch._C._dynamo``).

Each function names what it touches, why no public API serves, and the torch releases it was
verified on; ``tests/internals/test_dynamo_contracts.py`` checks each on every supported torch.
"""

from __future__ import annotations

from typing import Any


def eval_frame_stance() -> Any:
    """The stance ``torch.compiler.set_stance`` set last: an object with ``stance`` (``"default"``,
    ``"force_eager"``, ...) and ``skip_guard_eval_unsafe``.

    Reads ``torch._dynamo.eval_frame._stance``, rebound by every ``set_stance``, so read it per
    call. torch has no public getter for the stance in force. Verified: torch 2.11, 2.13, 2.14,
    2.15.
    """
    import torch._dynamo.eval_frame as eval_frame

    return eval_frame._stance


def stance_name() -> str:
    """The name of the stance in force (``"default"`` where this torch keeps none)."""
    return str(getattr(eval_frame_stance(), "stance", "default"))
