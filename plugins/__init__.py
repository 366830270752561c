"""torchkiln's built-in plugins: ordinary hook implementations, registered by default.

Each module here is registered under the name ``torchkiln.<module>`` (``torchkiln.backends``),
and a third-party plugin does nothing these cannot.
"""

BUILTIN_PLUGINS: tuple[str, ...] = (
    "torchkiln.plugins.backends",
    "torchkiln.plugins.selectors",
    "torchkiln.plugins.hierarchical",
    "torchkiln.plugins.single_process",
    "torchkiln.plugins.ddp",
    "torchkiln.plugins.fsdp2",
    "torchkiln.plugins.deepspeed",
    "torchkiln.plugins.xla",
    "torchkiln.plugins.hpu",
    "torchkiln.plugins.neuron",
    "torchkiln.plugins.tensorrt",
    "torchkiln.plugins.tvm",
    "torchkiln.plugins.accelerate_config",
    "torchkiln.plugins.transformers_models",
    "torchkiln.plugins.transformers_nested",
    "torchkiln.plugins.accelerate_hooks",
)
