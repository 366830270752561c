"""The one adapter between torchkiln and the private parts of torch, transformers and accelerate.

Every read or write of a name those libraries keep private lives in a module of this package
(one per library or torch subsystem) behind a named function whose docstring says what it reads,
why no public API serves, and on which torch releases it was verified. ``tools/private_names.py``
(``tox -e lint``) fails on any use outside this package; ``tests/internals/`` holds one contract
test per access, run on every supported torch. docs/internals.md has the rule and the table of
every module and function.
"""
