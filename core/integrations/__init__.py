"""Integrations with training frameworks, each imported only when asked for.

- :mod:`torchkiln.integrations.lightning`: a Lightning ``Callback`` that compiles the
  ``LightningModule`` region by region, in place, when the ``Trainer`` starts.
- :mod:`torchkiln.integrations.transformers`: the same for the Hugging Face ``Trainer``, as a
  ``TrainerCallback`` (or use ``torchkiln.compat.accelerate.install()`` with
  ``TrainingArguments(torch_compile=True)``).

``import torchkiln`` imports neither framework.
"""
