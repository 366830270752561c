"""The Hugging Face ``Trainer``: compile the model region by region, in place, when training
starts, with :class:`TorchkilnCallback` (``torch_compile=False``: torchkiln's own configuration)
or with ``torchkiln.compat.accelerate.install()`` and ``TrainingArguments(torch_compile=True)``
(docs/integrations/transformers-trainer.md compares them). Either way the model stays the same
object of the same class and the Trainer's checkpoints have plain keys.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from torchkiln.integrations import callback_options


class TorchkilnCallback(TrainerCallback):  # type: ignore[misc]
    """Compiles the Trainer's model with :func:`torchkiln.compile` in ``on_train_begin``
    (after ``Accelerator.prepare``; in place, so inside DDP too); a model already compiled
    (by ``install()``, say) is left as it is.

    :param config: as :func:`torchkiln.compile`'s ``config``.
    :param options: ``CompileConfig`` fields; ``distributed`` must be ``none`` (the Trainer's
        Accelerator does the wrapping).
    """

    def __init__(self, config: Any = None, **options: Any) -> None:
        self.config = config
        self.options = callback_options("the Hugging Face Trainer", options)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        import torchkiln

        model = kwargs.get("model")
        if model is not None and not torchkiln.is_compiled(model):
            torchkiln.compile(model, self.config, **self.options)


__all__ = ["TorchkilnCallback"]
