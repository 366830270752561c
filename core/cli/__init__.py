"""The ``torchkiln`` command line (``[project.scripts]`` names :func:`main`): ``plugins``,
``plan``, ``config``, ``precompile`` and the commands of :mod:`torchkiln.bench` and
:mod:`torchkiln.compat`.
"""

from torchkiln.cli.commands import main

__all__ = ["main"]
