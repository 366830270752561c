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
  each release has (``feature_problem`` names feature, API and release for the ``ConfigError``).
- :mod:`torchkiln._internals.cache_entries`, :mod:`~torchkiln._internals.aot_artifacts`: Dynamo's
  cache entries and guards as one ``GuardTable``; torch's saved (AOT) compiled functions.
- :mod:`torchkiln._internals.frame_strategy`: undoing Dynamo's "skip this code for good".
- :mod:`torchkiln._internals.tvm_backend`: which TVM frontend torch's ``tvm`` backend uses.
- :mod:`torchkiln._internals.dynamo`: Dynamo's stance, counters, compilation metrics, settings,
  ``comptime``, the ``torch.compile`` wrapper class, backends, the static-address tag.
- :mod:`torchkiln._internals.inductor`: inductor's settings, cache directory, kernel-template
  parser, CPU ISA probe and C++ compiler.
- :mod:`torchkiln._internals.nn_module`, :mod:`~torchkiln._internals.autograd`,
  :mod:`~torchkiln._internals.fake_tensor`, :mod:`~torchkiln._internals.fsdp`: ``nn.Module``'s
  own dicts, a tensor's version counter, fake tensors, composable activation checkpointing.
- :mod:`torchkiln._internals.transformers`, :mod:`~torchkiln._internals.accelerate`,
  :mod:`~torchkiln._internals.diffusers`: those libraries' private attributes and registries.

docs/internals.md has the table of every function.
"""
