"""Compatibility layers for code written against other libraries: Hugging Face Accelerate's
dynamo helpers on torchkiln (:mod:`torchkiln.compat.accelerate`). Nothing here is imported by
``import torchkiln``.
"""
