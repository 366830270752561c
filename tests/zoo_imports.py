"""Importing the zoo's libraries on a CPU torch.

timm imports torchvision, and the only torchvision a registry may serve is built for CUDA
torch: beside a CPU torch its C extension does not load and ``import torchvision`` fails with
``operator torchvision::nms does not exist`` (its fake-kernel registrations for ``nms`` and
``qnms`` are unconditional). :func:`import_timm` makes such a torchvision harmless: it declares
those two operators' schemas (no kernel: calling them raises) before torchvision is imported.
Models that do not call them (EfficientNet, ConvNeXt) build and run. Install with
``pip install -c constraints.txt --no-deps timm torchvision`` so that neither pulls a torch.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

_NMS_SCHEMA = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"


def _declare_missing_torchvision_ops() -> None:
    for op in ("nms", "qnms"):
        if not torch._C._dispatch_has_kernel(f"torchvision::{op}") and not hasattr(
            torch.ops.torchvision, op
        ):
            torch.library.define(f"torchvision::{op}", _NMS_SCHEMA)


def harmless_torchvision() -> None:
    """If a torchvision is installed whose C extension does not fit this torch, declare the
    operators its import needs, so that it (and transformers, peft, diffusers, timm, which
    import it) imports. Nothing when torchvision is absent or fits."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return
    try:
        import torchvision  # noqa: F401
    except RuntimeError as error:
        if "does not exist" not in str(error):
            raise
        _declare_missing_torchvision_ops()


def import_timm() -> ModuleType:
    """``timm``, or a skip saying why it cannot be imported here."""
    try:
        import torchvision  # noqa: F401
    except ModuleNotFoundError:
        pytest.skip("timm needs torchvision, which is not installed (see docs/zoo.md)")
    except RuntimeError as error:
        if "does not exist" not in str(error):
            raise
        _declare_missing_torchvision_ops()
    return pytest.importorskip("timm")
