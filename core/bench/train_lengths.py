"""``torchkiln bench --workload train --lengths L1,L2,...``: training with variable sequence
lengths, as a padding collator gives them, one fresh process per strategy (:func:`main`) with
an empty inductor cache of its own, the same lengths in every one.

Per strategy: the first step, the median later step, the total for all steps; for tiered, where
its builder stood (the step it switched at, or why it did not start or finish), the median step
while it built against regional's steady step, and the steps after the switch against full's:
across processes and, once switched, alternating with a full compile of the same weights in
the tiered process (``alternate`` rounds: the same machine conditions for both).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torchkiln.bench.results import json_argv, run_json_process, write_result
from torchkiln.bench.strategies import alternate_rounds

STRATEGIES = ("full", "regional", "tiered")


def summary(run: dict[str, Any]) -> dict[str, Any]:
    steps = run["step_seconds"]
    tiers = run["tiers"]
    out = {
        "first_s": steps[0],
        "later_median_s": statistics.median(steps[1:]),
        "total_s": sum(steps),
    }
    if tiers is not None:
        building = [
            s for s, at in zip(steps[1:], run["tiers_at"][1:], strict=True) if at == "building"
        ]
        switched = tiers["switched_at_call"]
        out |= {
            "building_median_s": statistics.median(building) if building else None,
            "after_switch_median_s": statistics.median(steps[switched:])
            if switched and switched < len(steps)
            else None,
            "switched_at_step": switched,
            "state": tiers["state"],
            "reason": tiers["reason"],
            "builder_processes": tiers["builder_processes"],
            "seconds_to_switch": tiers.get("seconds_to_switch"),
            "misses": tiers.get("misses", 0),
            "cost_line": next(
                (x.strip() for x in tiers["lines"] if "cost to the steps" in x), None
            ),
        }
        alternating = run.get("alternating")
        if alternating:
            out["alternating_vs_full"] = statistics.median(alternating["tiered_s"]) / (
                statistics.median(alternating["full_s"])
            )
            out["alternating_rounds"] = len(alternating["tiered_s"])
    return out


def run_train_lengths(
    strategies: tuple[str, ...], base: dict[str, Any], json_path: str | None, timeout: float
) -> dict[str, Any]:
    """Each strategy's process on ``base`` (``model``, ``depth``, ``batch``, ``lengths``,
    ``steps``, ``backend``, ``threads``, ``tiered_when``, ``alternate``); print the table,
    write ``json_path``."""
    runs = {}
    for strategy in strategies:
        print(f"torchkiln bench --lengths: {strategy} ...", file=sys.stderr, flush=True)
        work = Path(tempfile.mkdtemp(prefix="torchkiln-train-"))
        # cold: an empty inductor cache of its own (runs before it must not warm this one)
        env = {"TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-cache")}
        settings = {**base, "strategy": strategy}
        run_json_process(
            "torchkiln.bench.train_lengths", work / "result.json", settings, strategy, env, timeout
        )
        runs[strategy] = json.loads((work / "result.json").read_text())
    result = {"settings": base, "runs": runs, "summary": {s: summary(r) for s, r in runs.items()}}
    print(render(result))
    if json_path:
        write_result(json_path, result)
    return result


def render(result: dict[str, Any]) -> str:
    s, summaries = result["settings"], result["summary"]
    distinct = len(set(s["lengths"]))
    lines = [
        f"torchkiln bench --lengths: {s['model']} depth {s['depth']}, batch {s['batch']}, "
        f"{s['steps']} training steps (AdamW), lengths from {min(s['lengths'])} to "
        f"{max(s['lengths'])} ({distinct} values), {s['backend']}"
        + (f", torch threads {s['threads']}" if s.get("threads") else "")
        + (f", tiered.when {s['tiered_when']}" if s.get("tiered_when", "auto") != "auto" else ""),
        f"{'strategy':<10}{'first step s':>13}{'median later ms':>17}{'total s':>10}",
    ]
    for name, row in summaries.items():
        lines.append(
            f"{name:<10}{row['first_s']:>13.1f}{row['later_median_s'] * 1000:>17.0f}{row['total_s']:>10.1f}"
        )
    tiered, regional, full = (summaries.get(k) for k in ("tiered", "regional", "full"))
    if tiered is not None:
        lines += _tiered_lines(tiered, full)
        if regional is not None:
            lines.append(
                f"  tiered total / regional total: {tiered['total_s'] / regional['total_s']:.2f}"
            )
            if tiered["building_median_s"] is not None:
                ratio = tiered["building_median_s"] / regional["later_median_s"]
                lines.append(f"  tiered median step while building / regional's: {ratio:.2f}")
        if full is not None and tiered["after_switch_median_s"] is not None:
            ratio = tiered["after_switch_median_s"] / full["later_median_s"]
            lines.append(f"  tiered median step after the switch / full's: {ratio:.2f}")
        if tiered.get("alternating_vs_full") is not None:
            lines.append(
                "  tiered step after the switch / full's, alternating in one process "
                f"({tiered['alternating_rounds']} rounds): {tiered['alternating_vs_full']:.3f}"
            )
    return "\n".join(lines)


def _tiered_lines(tiered: dict[str, Any], full: dict[str, Any] | None) -> list[str]:
    """Where tiered's builder stood: the switch (its step and seconds, against full compile's
    first step), or why none; what it cost the steps; the calls its form did not fit."""
    lines = []
    if tiered["switched_at_step"]:
        line = f"  tiered: switched at step {tiered['switched_at_step']}"
        seconds = tiered.get("seconds_to_switch")
        if seconds is not None:
            line += f", {seconds:.1f} s after the first step began"
            if full is not None:
                line += f" ({seconds / full['first_s']:.2f}x full compile's first step)"
        lines.append(line)
    else:
        lines.append(f"  tiered: no switch ({tiered['state']}): {tiered['reason']}")
    lines.append(f"  tiered: builder processes {tiered['builder_processes']}")
    if tiered.get("cost_line"):
        lines.append(f"  tiered: {tiered['cost_line']}")
    if tiered.get("misses"):
        lines.append(
            f"  tiered: {tiered['misses']} steps outside the whole-model form ran regionally"
        )
    return lines


# -- one strategy's process ------------------------------------------------------------------------


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


TIER_FIELDS = (
    "state", "reason", "switched_at_call", "calls", "builder_processes", "seconds_to_switch",
    "misses", "builds", "builder_slowdown", "builder_period",
)  # fmt: skip
"""What a tiered run's record keeps of its tiers' report (and its ``lines()``)."""


def measure(settings: dict[str, Any]) -> dict[str, Any]:
    """One strategy's run: builds the bench model, applies the strategy (``tiered`` with
    ``tiered_when``), trains ``steps`` AdamW steps whose sequence length is drawn from
    ``lengths``; every step's seconds, and for tiered where the tiers stood at each step."""
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
    tiered = settings["strategy"] == "tiered"
    seconds, tiers_at = [], []
    for length in lengths_for(settings):
        ids = torch.randint(0, vocab, (settings["batch"], length), generator=generator)
        seconds.append(train_step(compiled, optimizer, ids))
        tiers = torchkiln.tiered.tiers(compiled) if tiered else None
        # "building": the form pending once a builder started (State has no word for it)
        building = tiers is not None and tiers.state == "pending" and tiers.builds > 0
        tiers_at.append(("building" if building else tiers.state) if tiers is not None else None)
    tiers = torchkiln.tiered.tiers(compiled) if tiered else None
    alternating = None
    if tiers is not None and tiers.source == "the builder" and settings.get("alternate"):
        alternating = alternate_with_full(settings, model, compiled, optimizer, generator, vocab)
    return {
        "alternating": alternating,
        "strategy": settings["strategy"],
        "step_seconds": seconds,
        "tiers_at": tiers_at,
        "threads": torch.get_num_threads(),
        "tiers": None
        if tiers is None
        else {name: getattr(tiers, name) for name in TIER_FIELDS} | {"lines": tiers.lines()},
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
    pick = random.Random(settings.get("seed", 0) + 1)
    batches = [
        torch.randint(0, vocab, (settings["batch"], pick.choice(lengths)), generator=generator)
        for _ in range(settings["alternate"])
    ]
    tiered_ids, full_ids = iter(batches), iter(batches)  # each round: the same batch for both
    return alternate_rounds(
        {"tiered_s": lambda: train_step(tiered, optimizer, next(tiered_ids)),
         "full_s": lambda: train_step(full, full_optimizer, next(full_ids))},
        settings["alternate"],
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """``python -m torchkiln.bench.train_lengths OUT_JSON SETTINGS_JSON``: one strategy's run."""
    out, settings = json_argv(argv)
    if settings.get("threads"):
        import torch

        torch.set_num_threads(settings["threads"])
    write_result(out, measure(settings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
