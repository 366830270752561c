"""Deprecated (plugin API v1): import these names from :mod:`torchkiln.plugin`."""

from torchkiln.v1_compat import v1_names

__getattr__ = v1_names(__name__)
