"""Configuration: :class:`~torchkiln.configuration.config.CompileConfig`, its readers (file,
environment, limited YAML/JSON) and its checks (types, ranges, torch options, what a file may set).

Imports nothing of torchkiln but :mod:`torchkiln.errors`.
"""
