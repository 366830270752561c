"""Stand-in for ``habana_frameworks.torch.utils.internal``."""

import os


def is_lazy():
    # Recent Gaudi releases default to eager mode (0); older ones defaulted to lazy (1).
    return os.environ.get("PT_HPU_LAZY_MODE", "0") != "0"
