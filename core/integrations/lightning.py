"""Lightning: compile the ``LightningModule`` region by region, in place, when training starts.

The module stays the same object of the same class (no ``OptimizedModule`` for Lightning to
special-case) and its checkpoint keys stay plain. With Fabric no helper is needed: call
``torchkiln.compile(model)`` before ``fabric.setup(model, ...)`` (docs/integrations/lightning.md).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from torchkiln.integrations import callback_options


class TorchkilnCallback(pl.Callback):  # type: ignore[misc]
    """Compiles ``pl_module`` with :func:`torchkiln.compile` at the start of ``fit``,
    ``validate``, ``test`` or ``predict`` — after ``configure_model`` and after the strategy
    set the module up (device, DDP) — once; a module already compiled is left as it is.

    :param config: as :func:`torchkiln.compile`'s ``config`` (a YAML path, a mapping, a
        ``CompileConfig``; default ``$TORCHKILN_CONFIG`` or ``./torchkiln.yaml``).
    :param options: ``CompileConfig`` fields (``backend="inductor"``, ``regions=...``).
        ``distributed`` must be ``none``: Lightning's strategy does the wrapping.
    """

    def __init__(self, config: Any = None, **options: Any) -> None:
        self.config = config
        self.options = callback_options("Lightning", options)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        import torchkiln

        if not torchkiln.is_compiled(pl_module):
            torchkiln.compile(pl_module, self.config, **self.options)

    on_validation_start = on_test_start = on_predict_start = on_fit_start


__all__ = ["TorchkilnCallback"]
