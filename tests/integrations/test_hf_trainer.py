"""The Hugging Face ``Trainer`` compiles region by region with torchkiln: through its own
``torch_compile`` switch once ``torchkiln.compat.accelerate.install()`` is in effect, or with
``torchkiln.integrations.transformers.TorchkilnCallback``. Real ``Trainer.train`` runs on CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tiny_models import tiny_llama, weight_sum  # noqa: E402

import torchkiln  # noqa: E402
from torchkiln.compat.accelerate import install  # noqa: E402

STEPS = 3
REGIONS = [
    ("model.layers.0", "compiled"),
    ("model.layers.1", "compiled"),
    ("model.embed_tokens", "compiled"),
    ("model.norm", "compiled"),
    ("lm_head", "compiled"),
]


class TokenData(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2 * STEPS

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


def train(root: Path, callbacks: list[Any] | None = None, **arguments: Any) -> Any:
    args = transformers.TrainingArguments(
        output_dir=str(root),
        use_cpu=True,
        max_steps=STEPS,
        per_device_train_batch_size=2,
        learning_rate=0.01,
        save_steps=STEPS,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        **arguments,
    )
    trainer = transformers.Trainer(
        model=tiny_llama(), args=args, train_dataset=TokenData(), callbacks=callbacks
    )
    trainer.train()
    return trainer


def losses(trainer: Any) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def loads_into_a_plain_model(checkpoint_dir: Path, trained: torch.nn.Module) -> None:
    from safetensors.torch import load_file

    saved = load_file(str(checkpoint_dir / "model.safetensors"))
    assert not any("_orig_mod" in key for key in saved)
    plain = tiny_llama(seed=1)
    plain.load_state_dict(saved, strict=True)
    assert weight_sum(plain) == pytest.approx(weight_sum(trained), rel=1e-6)


@pytest.fixture(scope="module")
def eager_trainer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return train(tmp_path_factory.mktemp("eager"))


@pytest.fixture(scope="module")
def eager_losses(eager_trainer: Any) -> list[float]:
    return losses(eager_trainer)


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_accelerate")
def test_trainer_torch_compile_switch_compiles_regionally_with_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, eager_losses: list[float], eager_trainer: Any
) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "1")
    with install():
        trainer = train(tmp_path, torch_compile=True, torch_compile_backend="eager")
    model = trainer.model
    assert type(model).__name__ == "LlamaForCausalLM" and trainer.model_wrapped is model
    assert type(model.model.layers[0]).__name__ == "LlamaDecoderLayer"
    regions = torchkiln.report(model).to_dict()["regions"]
    assert [(r["path"], r["status"]) for r in regions] == REGIONS
    print(torchkiln.report(model))  # the regions compiled, in the test log
    assert losses(trainer) == pytest.approx(eager_losses, rel=1e-5)
    loads_into_a_plain_model(tmp_path / f"checkpoint-{STEPS}", model)
    # Evaluation: the same model object, its blocks compiled for inference (no gradients: new
    # graphs, none of them eager) and eager's loss.
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    with install():
        metrics = trainer.evaluate(TokenData())
    report = torchkiln.report(model)
    # Dynamo's own count: one new graph per region group (4: blocks, embeddings, norm, lm_head)
    assert trainer.model is model and counters["stats"]["unique_graphs"] == graphs + 4
    assert sum(r.later_graphs for r in report.regions) == 4  # the report says the same
    assert {r.status for r in report.regions} == {"compiled"}
    assert metrics["eval_loss"] == pytest.approx(
        eager_trainer.evaluate(TokenData())["eval_loss"], rel=1e-5
    )


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_accelerate")
def test_trainer_callback_compiles_regionally(tmp_path: Path, eager_losses: list[float]) -> None:
    from torchkiln.integrations.transformers import TorchkilnCallback

    trainer = train(tmp_path, callbacks=[TorchkilnCallback(backend="eager")])
    model = trainer.model
    regions = torchkiln.report(model).to_dict()["regions"]
    assert [(r["path"], r["status"]) for r in regions] == REGIONS[:2]  # rest: eager (default)
    assert losses(trainer) == pytest.approx(eager_losses, rel=1e-5)
    loads_into_a_plain_model(tmp_path / f"checkpoint-{STEPS}", model)
