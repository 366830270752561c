"""Deprecated (plugin API v1): import these names from :mod:`torchkiln.plugin`."""

from torchkiln.v1_compat import deprecated_module

__getattr__ = deprecated_module(__name__, ("EagerPart", "Region", "RegionGroup", "RegionPlan"))
