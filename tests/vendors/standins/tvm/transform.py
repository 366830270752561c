"""Stand-in for ``tvm.transform``."""

import contextlib

import tvm


@contextlib.contextmanager
def PassContext(opt_level=2, config=None):  # TVM spells it so
    tvm.CALLS["opt_levels"].append(opt_level)
    yield
