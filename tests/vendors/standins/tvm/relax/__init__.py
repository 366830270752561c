"""Stand-in for ``tvm.relax``: only the PyTorch frontend (``relax.frontend.torch``)."""
