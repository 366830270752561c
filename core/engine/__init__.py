"""The engine: resolving the effective configuration, checking a region plan, compiling regions
in place (first-call shims, trace settings, Dynamo's records of each compile)
and undoing it; progress, CUDA-graph steps, process-wide settings held per model.

Imports :mod:`torchkiln.plugin_host`, :mod:`torchkiln.configuration` and the leaves only.
"""
