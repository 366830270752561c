"""torch's fake tensors (``torch._subclasses.fake_tensor``), which torchkiln runs a model on."""

from __future__ import annotations

import contextlib
from typing import Any


def fake_tensor_mode(
    *, allow_non_fake_inputs: bool = False
) -> contextlib.AbstractContextManager[Any]:
    """A new ``FakeTensorMode``: inside it, tensors created or computed carry metadata only
    (shape, dtype, device), and with ``allow_non_fake_inputs`` real tensors passed in become
    fake on use.

    Calls ``torch._subclasses.fake_tensor.FakeTensorMode``: torch has no public fake-tensor
    mode. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=allow_non_fake_inputs)
