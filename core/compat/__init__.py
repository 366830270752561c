"""Compatibility layers for code written against other libraries.

``torchkiln.compat.accelerate`` gives Hugging Face Accelerate users their dynamo
configuration and ``compile_regions`` calls, running on torchkiln, and ``install()``, which
makes an unmodified ``Accelerator`` compile with torchkiln. Nothing here is imported by
``import torchkiln``; Accelerate itself is imported only by ``install()``.
"""
