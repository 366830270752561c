"""The one-store cell: the same script run twice with ``store=DIR``, against full compile.

Three processes, one after the other, each with an inductor cache of its own: full
``torch.compile`` cold; then ``torchkiln.compile(model, store=DIR)`` twice. Each process times
its compile and first call; the second store run, which starts from what the first one stored,
also alternates rounds with a full-compiled copy of the same model in the same process, so its
steady-state ratio to full is free of the drift between processes.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torchkiln.bench.results import collect_environment, json_argv, run_json_process, write_result
from torchkiln.bench.settings import EXIT_TARGET_MISSED
from torchkiln.bench.strategies import alternate_rounds, timed
from torchkiln.bench.targets import verdict

ROLES = ("full", "store-first", "store-again")
BUILD_TIMEOUT = 1800.0


def _model_and_inputs(depth: int) -> tuple[Any, Any]:
    import torch

    from torchkiln.examples import example_inputs, llama

    torch.manual_seed(0)
    model = llama(depth=depth)
    return model, example_inputs(model)


def worker(role: str, store: str, depth: int, backend: str, rounds: int) -> dict[str, Any]:
    """One process of the cell (``python -m torchkiln.bench.store_restart OUT SETTINGS_JSON``,
    the settings this function's arguments)."""
    import torch

    import torchkiln
    import torchkiln.tiered

    model, inputs = _model_and_inputs(depth)
    started = time.perf_counter()
    if role == "full":
        compiled = torch.compile(model, backend=backend)
    else:
        tiers = {"when": "always", "max_slowdown": 0}  # measure how soon, not the bound
        compiled = torchkiln.compile(model, backend=backend, store=store, tiered=tiers)
    compile_seconds = time.perf_counter() - started

    def call(module: Any = compiled) -> float:
        return timed(lambda: module(inputs), "cpu")[0]

    with torch.no_grad():
        out = {"role": role, "compile_seconds": compile_seconds, "first_call_seconds": call()}
        if role != "full":
            out.update(_until_whole(compiled, inputs))
        if role == "store-again":
            full = torch.compile(_model_and_inputs(depth)[0], backend=backend)
            for _ in range(2):
                full(inputs)
            times = alternate_rounds({"mine": call, "full": lambda: call(full)}, rounds)
            out["steady_seconds"] = statistics.median(times["mine"])
            out["full_steady_seconds"] = statistics.median(times["full"])
        else:
            out["steady_seconds"] = statistics.median(call() for _ in range(rounds))
    report = torchkiln.tiered.tiers(compiled) if role != "full" else None
    if report is not None:
        out["serving"], out["tiers_state"] = report.serving, report.state
        out["tiers_source"] = report.source
    return out


def _until_whole(model: Any, inputs: Any) -> dict[str, Any]:
    """Call the model until it serves whole-model (the first store run's builder finishes)."""
    import torchkiln.tiered

    started = time.perf_counter()
    calls = 0
    if torchkiln.tiered.tiers(model) is None:  # no tiers for this model (docs/store.md)
        return {"calls_until_whole_model": None, "seconds_until_whole_model": None}
    while (report := torchkiln.tiered.tiers(model)).serving != "whole-model":
        if report.state == "failed" or time.perf_counter() - started > BUILD_TIMEOUT:
            break
        model(inputs)
        calls += 1
    return {
        "calls_until_whole_model": calls,
        "seconds_until_whole_model": time.perf_counter() - started,
    }


def run_cell(depth: int, backend: str, rounds: int, scratch: Path) -> list[dict[str, Any]]:
    """Run the three processes; returns their results in order."""
    results = []
    settings = {"store": str(scratch / "store"), "depth": depth, "backend": backend}
    for role in ROLES:
        env = {
            "TORCHINDUCTOR_CACHE_DIR": str(scratch / f"inductor-{role}"),
            "TORCHKILN_PROGRESS": "off",
        }
        out = scratch / f"{role}.json"
        print(
            f"torchkiln bench: store cell, {role} (depth {depth}) ...", file=sys.stderr, flush=True
        )
        run_json_process(
            "torchkiln.bench.store_restart", out, {"role": role, **settings, "rounds": rounds},
            f"the store cell's {role} process", env,
        )  # fmt: skip
        results.append(json.loads(out.read_text()))
    return results


def _start(result: dict[str, Any]) -> float:
    """A process's compile and first call."""
    return float(result["compile_seconds"] + result["first_call_seconds"])


def table(results: list[dict[str, Any]]) -> str:
    """The cell's table: each process's first call against full compile's cold one."""
    rows = [
        "| process | compile + first call | x full cold | steady | x full (alternating) | serving |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for result in results:
        start = _start(result)
        alternating = (
            f"{result['steady_seconds'] / result['full_steady_seconds']:.3f}x"
            if "full_steady_seconds" in result
            else "-"
        )
        rows.append(
            f"| {result['role']} | {start:.2f} s | {start / _start(results[0]):.3f}x | "
            f"{result['steady_seconds'] * 1e3:.2f} ms | {alternating} | "
            f"{result.get('serving', 'whole model')} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    out, settings = json_argv(argv)
    write_result(out, worker(**settings))
    return 0


TARGETS = (("start", 0.1), ("steady", 1.02))
"""The second store run against full compile: its compile and first call over full's cold
ones, and its steady state over full's in alternating rounds (docs/store.md)."""


def ratios(results: list[dict[str, Any]]) -> dict[str, float]:
    full, again = results[0], results[-1]
    steady = again["steady_seconds"] / again["full_steady_seconds"]
    return {"start": _start(again) / _start(full), "steady": steady}


def bench_store(
    depth: int, backend: str, rounds: int, json_path: Path | None, check: bool = False
) -> int:
    """``torchkiln bench --store``: the cell, its table and targets, and its JSON."""
    with tempfile.TemporaryDirectory(prefix="torchkiln-bench-store-") as scratch:
        results = run_cell(depth, backend, rounds, Path(scratch))
    print(table(results))
    found = ratios(results)
    for name, limit in TARGETS:
        print(
            f"target: second run's {name} <= {limit}x full's: {found[name]:.3f}x "
            f"({verdict(found[name], limit)})"
        )
    if json_path is not None:
        document = {"depth": depth, "backend": backend, "results": results, "ratios": found}
        document["environment"] = collect_environment("cpu")
        write_result(json_path, document)
    missed = any(found[name] > limit for name, limit in TARGETS)
    return EXIT_TARGET_MISSED if check and missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
