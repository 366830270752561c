"""Built-in plugin: NVIDIA Torch-TensorRT, backend ``tensorrt``.

``import torch_tensorrt`` registers the ``tensorrt`` dynamo backend (``torch_tensorrt`` in
older releases, which newer ones keep as an alias). It compiles forward graphs to TensorRT
engines for inference on CUDA GPUs. Its settings go in ``options`` (fields of
``torch_tensorrt.dynamo.CompilationSettings``); it ignores ``mode``, and silently drops option
keys it does not know, so torchkiln checks them against the list below.
"""

from __future__ import annotations

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
    torch_knows,
)

NAME = "tensorrt"
INSTALL_HINT = "pip install torch-tensorrt (needs a CUDA build of torch and an NVIDIA GPU)"
TORCH_BACKENDS = ("tensorrt", "torch_tensorrt")
"""The registered names, newest first."""

OPTIONS = (
    "enabled_precisions",
    "debug",
    "workspace_size",
    "min_block_size",
    "torch_executed_ops",
    "pass_through_build_failures",
    "max_aux_streams",
    "version_compatible",
    "optimization_level",
    "use_python_runtime",
    "truncate_double",
    "truncate_long_and_double",
    "use_fast_partitioner",
    "enable_experimental_decompositions",
    "device",
    "require_full_compilation",
    "disable_tf32",
    "sparse_weights",
    "make_refittable",
    "immutable_weights",
    "engine_capability",
    "num_avg_timing_iters",
    "dla_sram_size",
    "dla_local_dram_size",
    "dla_global_dram_size",
    "dryrun",
    "hardware_compatible",
    "timing_cache_path",
    "lazy_engine_init",
    "cache_built_engines",
    "reuse_cached_engines",
    "use_explicit_typing",
    "use_fp32_acc",
    "refit_identical_engine_weights",
    "strip_engine_weights",
    "enable_weight_streaming",
    "assume_dynamic_shape_support",
    "use_distributed_mode_trace",
    "offload_module_to_cpu",
    "tiling_optimization_level",
    "l2_limit_for_tiling",
)
"""CompilationSettings fields of Torch-TensorRT 2.x that are meaningful under torch.compile."""


def probe() -> Availability:
    return probe_import("torch_tensorrt", INSTALL_HINT)


def registered_name() -> str:
    """The torch backend name this torch_tensorrt registered (after it was imported)."""
    return next((name for name in TORCH_BACKENDS if torch_knows(name)), TORCH_BACKENDS[0])


@hookimpl
def declare_backends() -> Sequence[BackendSpec]:
    return [
        BackendSpec(
            NAME,
            "NVIDIA Torch-TensorRT (inference; settings in options)",
            probe=probe,
            training=False,
            modes=(),
            options=OPTIONS,
            devices=("cuda",),
            compile=compile_group,
        )
    ]


def compile_group(
    fn: Callable[..., Any], group: RegionGroup, config: CompileConfig
) -> Callable[..., Any]:
    """The ``tensorrt`` backend's compile of one region group (``BackendSpec.compile``)."""
    __import__("torch_tensorrt")  # registers the backend with torch._dynamo
    return compile_with_torch(fn, config, registered_name())
