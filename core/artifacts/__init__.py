"""Compiled artifacts: the persistent compile cache (its directory, carrying it elsewhere) and
precompiled region groups (:func:`torchkiln.precompile` writes an artifact directory,
``torchkiln.compile(..., artifacts=DIR)`` loads it), with the checks that decide whether it fits.

Imports :mod:`torchkiln.engine` and what lies below it.
"""
