"""The one adapter between torchkiln and the private parts of torch, transformers and accelerate.

Every read or write of a name those libraries keep private (``torch._dynamo``,
``torch._inductor``, transformers' ``_CAN_RECORD_REGISTRY``, ...) lives in a module of this
package, one per library or torch subsystem (:mod:`torchkiln._internals.dynamo`,
:mod:`~torchkiln._internals.inductor`, ...), behind a named function whose docstring says what
it reads, why no public API serves, and on which torch releases it was verified. The rest of
torchkiln never names a private attribute: ``tools/private_names.py`` (``tox -e lint``) fails
on any use outside this package, and ``tests/internals/`` holds one contract test per access,
run on every supported torch, so a release that renames something fails there, with the name.

docs/internals.md has the table of every module and function.
"""
