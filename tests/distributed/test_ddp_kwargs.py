"""What ``distributed.ddp`` passes to ``DistributedDataParallel`` (no process group needed)."""

from __future__ import annotations

from torch import nn

from torchkiln.config import DDPConfig
from torchkiln.plugins.ddp import ddp_kwargs


def test_unset_fields_keep_ddp_defaults_and_deprecated_ones_are_not_passed():
    kwargs = ddp_kwargs(DDPConfig(), {}, nn.Linear(2, 2))
    # broadcast_buffers is deprecated in torch 2.13 (it warns whenever given): only when set.
    assert kwargs == {
        "find_unused_parameters": False,
        "gradient_as_bucket_view": False,
        "static_graph": False,
    }


def test_set_fields_and_options_are_passed():
    settings = DDPConfig(broadcast_buffers=False, bucket_cap_mb=1.0)
    kwargs = ddp_kwargs(settings, {"static_graph": True}, nn.Linear(2, 2))
    assert kwargs["broadcast_buffers"] is False
    assert kwargs["bucket_cap_mb"] == 1.0
    assert kwargs["static_graph"] is True  # distributed.options wins over the section
