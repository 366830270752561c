"""The plugin system (the host side; the built-in plugins themselves are :mod:`torchkiln.plugins`):
the hook specifications, what plugins declare, the plugin manager that loads and checks them,
plugin faults, the region plan and the other data types hooks exchange.

Imports only :mod:`torchkiln.configuration` and :mod:`torchkiln.errors`.
"""
