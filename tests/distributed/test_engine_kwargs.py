"""What the ddp and fsdp2 sections pass to their engines (no process group needed)."""

from __future__ import annotations

from torch import nn

from torchkiln.configuration.config import DDPConfig
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


def test_fsdp2_mixed_precision_names_become_a_policy():
    import torch

    from torchkiln.configuration.config import FSDP2MixedPrecision
    from torchkiln.plugins.fsdp2 import mixed_precision_policy

    policy = mixed_precision_policy(
        FSDP2MixedPrecision(param_dtype="bfloat16", output_dtype="float32")
    )
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (
        torch.bfloat16,
        None,
        torch.float32,
    )
    assert policy.cast_forward_inputs is True
    assert FSDP2MixedPrecision().is_default()
    assert not FSDP2MixedPrecision(cast_forward_inputs=False).is_default()


def test_fsdp2_options_win_over_the_section():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    import torchkiln
    from torchkiln.engine.resolve import resolve_config
    from torchkiln.plugins.fsdp2 import shard_kwargs

    mine = MixedPrecisionPolicy(param_dtype=None)
    mesh = object()  # a user's mesh, passed through untouched (no process group needed)
    config = resolve_config(
        plugins=torchkiln.PluginManager(entry_points=False),
        env={},
        distributed={
            "strategy": "fsdp2",
            "fsdp2": {"mixed_precision": {"param_dtype": "bfloat16"}, "replicate_degree": 2},
            "options": {"mp_policy": mine, "mesh": mesh},
        },
    ).config
    kwargs = shard_kwargs(config, nn.Linear(2, 2))
    assert kwargs["mp_policy"] is mine
    assert kwargs["mesh"] is mesh
