"""The one adapter between torchkiln and the private parts of torch, transformers and accelerate.

Every read or write of a name those libraries keep private (``torch._dynamo``,
``torch._inductor``, ``torch._C._dynamo``, transformers' ``_CAN_RECORD_REGISTRY``, ...) lives in
a module of this package, behind a named function whose docstring says what it reads, why no
public API serves, and on which torch releases it was verified. The rest of torchkiln calls those
functions and never names a private attribute itself: ``tools/private_names.py`` (run by ``tox -e
lint``) fails on any use outside this package. ``tests/internals/`` holds one contract test per
access and runs on every supported torch, so a release that renames something fails there, with
the name, not in the middle of a user's call.

Modules, one per library or torch subsystem:

- :mod:`torchkiln._internals.versions`: which torch this is, the supported range, and the features
  each release has (``refuse`` raises the ``ConfigError`` that names feature and version).
"""
