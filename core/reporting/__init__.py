"""The compile report behind :func:`torchkiln.report`: per region, what Dynamo compiled and what it
cost, read from the engine's state and Dynamo's records; its table.

Imports :mod:`torchkiln.engine` and what lies below it.
"""
