"""Hugging Face Accelerate's dynamo helpers, as drop-in functions running on torchkiln.

Change the import and keep the code::

    # from accelerate.utils import compile_regions, TorchDynamoPlugin
    from torchkiln.compat.accelerate import compile_regions, TorchDynamoPlugin

Kept from Accelerate: the names, arguments and defaults; ``compile_regions`` selects the
repeated blocks and compiles the parameterised leaves outside them (``lm_head``,
embeddings, final norm); the returned model has ``_orig_mod``; ``to_kwargs()``; the unwrap
flags. Changed, because Accelerate's behaviour is a defect there (see
``docs/migrating-from-accelerate.md``):

* compilation happens in place, on the same objects: no copied module keeps the original's
  bound ``forward`` (which made Accelerate's regional compile run nothing under mixed
  precision), no ``OptimizedModule`` wrappers, no ``_orig_mod.`` in ``state_dict()`` keys;
* blocks in ``nn.Sequential``, ``nn.ModuleDict`` and nested containers are found;
* ``nn.Linear`` and other ``torch.nn`` built-ins really compile (``Module.compile()``, which
  Accelerate's DeepSpeed and FSDP2 variants use, silently compiles nothing for them on torch
  2.11 to 2.13);
* unwrapping never modifies the prepared model, and ``keep_torch_compile=False`` returns the
  model itself (still compiled);
* a second ``compile_regions`` returns the model as it is (a double-compile warning when
  its options differ);
* a false ``ACCELERATE_DYNAMO_USE_DYNAMIC`` leaves ``dynamic=None``.

``install()`` makes an unmodified ``Accelerator`` use these (see
:mod:`torchkiln.compat.accelerate_install`); it is the one function here that imports
Accelerate.

The helpers are defined in :mod:`torchkiln.compat.accelerate_helpers`, which ``install()``
uses too; this module only gathers the public names.
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
