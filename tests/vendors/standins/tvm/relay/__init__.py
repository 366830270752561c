"""Stand-in for ``tvm.relay``: ``build`` returns a library whose ``default`` factory runs the
TorchScript module that ``frontend.from_pytorch`` kept."""

import tvm
from tvm.relay import frontend


def build(module, target=None, params=None):
    tvm.CALLS["builds"] += 1
    return {"default": lambda device: module}


__all__ = ["build", "frontend"]
