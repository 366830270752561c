"""Hugging Face Accelerate's dynamo helpers, as drop-in functions running on torchkiln.

Change the import and keep the code::

    # from accelerate.utils import compile_regions, TorchDynamoPlugin
    from torchkiln.compat.accelerate import compile_regions, TorchDynamoPlugin

Names, arguments and defaults are Accelerate's; what differs is where Accelerate's behaviour
is a defect: compilation is in place (no copies, no ``OptimizedModule`` wrappers, no
``_orig_mod.`` in ``state_dict()`` keys) and unwrapping never modifies the prepared model.
``install()``, the one function here that imports Accelerate, makes an unmodified
``Accelerator`` use these (:mod:`torchkiln.compat.accelerate_install`). The helpers are defined
in :mod:`torchkiln.compat.accelerate_helpers`; docs/migrating-from-accelerate.md says why.
"""

from torchkiln.compat.accelerate_helpers import (
    ACCELERATE_REGIONS as ACCELERATE_REGIONS,
)
from torchkiln.compat.accelerate_helpers import (
    TORCH_COMPILE_DEFAULTS as TORCH_COMPILE_DEFAULTS,
)
from torchkiln.compat.accelerate_helpers import (
    DynamoBackend,
    TorchDynamoPlugin,
    compile_regions,
    compile_regions_deepspeed,
    compile_regions_fsdp2,
    extract_model_from_parallel,
    has_compiled_regions,
    is_compiled_module,
)
from torchkiln.compat.accelerate_helpers import backend_name as backend_name
from torchkiln.compat.accelerate_helpers import torchkiln_options as torchkiln_options
from torchkiln.compat.accelerate_install import Installation, install, is_installed, uninstall

__all__ = [
    "DynamoBackend",
    "Installation",
    "TorchDynamoPlugin",
    "compile_regions",
    "compile_regions_deepspeed",
    "compile_regions_fsdp2",
    "extract_model_from_parallel",
    "has_compiled_regions",
    "install",
    "is_compiled_module",
    "is_installed",
    "uninstall",
]
