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
from typing import Any

from torchkiln.bench.results import write_result


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
        seconds.append(train_step(compiled, optimizer, ids))
        tiers = torchkiln.tiered.tiers(compiled) if settings["strategy"] == "tiered" else None
        tiers_at.append(tiers.state if tiers is not None else None)
    tiers = torchkiln.tiered.tiers(compiled) if settings["strategy"] == "tiered" else None
    alternating = None
    if tiers is not None and tiers.state == "switched" and settings.get("alternate"):
        alternating = alternate_with_full(settings, model, compiled, optimizer, generator, vocab)
    return {
        "alternating": alternating,
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


def train_step(compiled: Any, optimizer: Any, ids: Any) -> float:
    """One AdamW step on ``ids``; its seconds."""
    started = time.perf_counter()
    loss = compiled(ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def alternate_with_full(
    settings: dict[str, Any], model: Any, tiered: Any, optimizer: Any, generator: Any, vocab: int
) -> dict[str, list[float]]:
    """After the switch, in this one process: full ``torch.compile`` of a copy with the same
    weights (warmed on two lengths: its static compile, then its dynamic recompile), then
    ``alternate`` rounds of one tiered step and one full step on the same batch, so that the
    two forms are compared under the same machine conditions (runs in separate processes
    drift by a few percent)."""
    import torch

    from torchkiln.examples import load_model

    plain = load_model(settings["model"], depth=settings["depth"]).train()
    plain.load_state_dict(model.state_dict())
    full = torch.compile(plain, backend=settings["backend"])
    full_optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-4)
    lengths = sorted(set(settings["lengths"]))
    for length in (lengths[0], lengths[-1]):  # full compile's static and dynamic compiles
        train_step(full, full_optimizer, torch.randint(0, vocab, (settings["batch"], length)))
    out: dict[str, list[float]] = {"tiered_s": [], "full_s": []}
    pick = random.Random(settings.get("seed", 0) + 1)
    for _ in range(settings["alternate"]):
        ids = torch.randint(
            0, vocab, (settings["batch"], pick.choice(lengths)), generator=generator
        )
        out["tiered_s"].append(train_step(tiered, optimizer, ids))
        out["full_s"].append(train_step(full, full_optimizer, ids))
    return out


def main(argv: list[str] | None = None) -> int:
    args = argv or sys.argv
    settings = json.loads(args[2])
    if settings.get("threads"):
        import torch

        torch.set_num_threads(settings["threads"])
    write_result(args[1], measure(settings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
