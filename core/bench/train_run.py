"""One strategy's variable-length training run for ``torchkiln bench --lengths`` (started in a
process of its own by :mod:`torchkiln.bench.train_lengths`).

``python -m torchkiln.bench.train_run OUT_JSON SETTINGS_JSON``: builds the bench model, applies
the strategy (``eager``, ``full``, ``regional``, ``tiered`` with ``tiered_when``, default ``auto``),
trains ``steps`` AdamW steps whose sequence length is drawn from ``lengths`` (a seeded
generator: the same lengths for every strategy, as a padding collator gives them) and writes
every step's seconds, and for tiered where the tiers stood at each step.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any


def lengths_for(settings: dict[str, Any]) -> list[int]:
    """The sequence length of every step (the same for every strategy)."""
    pick = random.Random(settings.get("seed", 0))
    return [pick.choice(settings["lengths"]) for _ in range(settings["steps"])]


def apply(strategy: str, model: Any, backend: str, tiered_when: str = "auto") -> Any:
    import torch

    import torchkiln

    if strategy == "eager":
        return model
    if strategy == "full":
        return torch.compile(model, backend=backend)
    if strategy in ("regional", "tiered"):
        tiered = {"enabled": strategy == "tiered", "when": tiered_when}
        return torchkiln.compile(model, backend=backend, tiered=tiered, progress="off")
    raise SystemExit(f"unknown strategy {strategy!r}")


def measure(settings: dict[str, Any]) -> dict[str, Any]:
    import torch

    import torchkiln
    import torchkiln.tiered
    from torchkiln.examples import load_model

    torch.manual_seed(0)
    model = load_model(settings["model"], depth=settings["depth"]).train()
    compiled = apply(
        settings["strategy"], model, settings["backend"], settings.get("tiered_when", "auto")
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(1)
    vocab = int(getattr(model.config, "vocab_size"))  # noqa: B009 (a transformers config)
    seconds, tiers_at = [], []
    for length in lengths_for(settings):
        ids = torch.randint(0, vocab, (settings["batch"], length), generator=generator)
        started = time.perf_counter()
        loss = compiled(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - started)
        tiers = torchkiln.tiered.tiers(compiled) if settings["strategy"] == "tiered" else None
        tiers_at.append(tiers.state if tiers is not None else None)
    tiers = torchkiln.tiered.tiers(compiled) if settings["strategy"] == "tiered" else None
    return {
        "strategy": settings["strategy"],
        "step_seconds": seconds,
        "tiers_at": tiers_at,
        "threads": torch.get_num_threads(),
        "tiers": None
        if tiers is None
        else {
            "state": tiers.state,
            "reason": tiers.reason,
            "switched_at_call": tiers.switched_at_call,
            "calls": tiers.calls,
            "builder_processes": tiers.builder_processes,
            "seconds_to_switch": tiers.seconds_to_switch,
            "misses": tiers.misses,
            "builds": tiers.builds,
            "builder_slowdown": tiers.builder_slowdown,
            "builder_period": tiers.builder_period,
            "lines": tiers.lines(),
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = argv or sys.argv
    settings = json.loads(args[2])
    if settings.get("threads"):
        import torch

        torch.set_num_threads(settings["threads"])
    Path(args[1]).write_text(json.dumps(measure(settings), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
