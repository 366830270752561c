"""Stand-in for ``tvm.relax.frontend``."""
