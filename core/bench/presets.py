"""The bench presets: ``--quick`` (README's main job) and ``--preset gpu``.

The quick preset is one grid whose cells are chosen to fit README's promise (at most 6
minutes after installation on a quiet 2-core machine). The gpu preset is a plan of runs for one
CUDA GPU, in the order they run. A plan is a list of runs, each a :class:`BenchSettings` grid for one workload and compile
mode. The runs are executed depth by depth, most valuable first (:func:`execution_order`),
so that when the time budget runs out what is missing is what matters least.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from torchkiln.bench.settings import BenchSettings


GPU_MODEL = "llama-1b"
GPU_DEPTHS = (32, 16)
"""Deepest first: depth 32 is where the strategies differ most."""
GPU_BATCHES = (1,)
GPU_SEQ = 128
GPU_DTYPE = "bfloat16"
GPU_MODES: tuple[str | None, ...] = (None, "reduce-overhead")
"""``None`` is torch.compile's default mode."""
GPU_WORKLOADS = ("forward", "generate")
GPU_STRATEGIES = ("eager", "full", "regional", "tiered", "accelerate")
"""hierarchical and precompiled are left out to fit the budget (``precompiled`` also needs
torch 2.13's ``aot_compile``); ``--strategies`` adds them back. ``tiered`` needs it too: on an
older torch (the GPU machine's 2.11) the preset leaves it out and says why."""
GPU_STEADY_ITERS = {"forward": 20, "generate": 10}
"""Timed calls per cell; a generate call is 16 tokens, its number the median of 15 gaps."""
GPU_BUDGET_MINUTES = 8.0
GPU_JSON = "bench-gpu.json"
GPU_PLOT = "bench-gpu.png"
GPU_TIMEOUT = 420.0
"""One worker process at most (a full compile of depth 32 under reduce-overhead included)."""


def mode_name(mode: str | None) -> str:
    return mode or "default"


def gpu_plan(
    *,
    strategies: tuple[str, ...] = GPU_STRATEGIES,
    depths: tuple[int | None, ...] = GPU_DEPTHS,
    device: str = "cuda",
    **overrides: object,
) -> list[BenchSettings]:
    """The runs of the gpu preset: one per workload and mode, each over ``depths``.

    ``eager`` does not depend on the compile mode, so it runs only in the default-mode runs.
    ``overrides`` replace other :class:`BenchSettings` fields in every run.
    """
    from torchkiln.bench.settings import BenchSettings

    runs = []
    for mode in GPU_MODES:
        for workload in GPU_WORKLOADS:
            chosen = tuple(s for s in strategies if mode is None or s != "eager")
            fields: dict[str, object] = {
                "model": GPU_MODEL,
                "depths": depths,
                "batches": GPU_BATCHES,
                "seq": GPU_SEQ,
                "strategies": chosen,
                "backend": "inductor",
                "workload": workload,
                "device": device,
                "dtype": GPU_DTYPE,
                "mode": mode,
                "steady_iters": GPU_STEADY_ITERS[workload],
                "warm": False,
                "timeout": GPU_TIMEOUT,
                "preset": "gpu",
                "steady_in_first_call": True,
            }
            fields.update(overrides)
            runs.append(BenchSettings(**fields))  # type: ignore[arg-type]
    return [run for run in runs if run.strategies]


@attrs.frozen
class Step:
    """One run of the plan at one depth: what executes as a unit, in plan order."""

    run: int
    """Index of the run in the plan."""
    settings: BenchSettings
    """The run's settings narrowed to this one depth."""

    @property
    def context(self) -> str:
        """What tells this run apart from the plan's others: ``forward, mode default``."""
        return f"{self.settings.workload}, mode {mode_name(self.settings.mode)}"


def execution_order(plan: list[BenchSettings]) -> list[Step]:
    """Every run at every depth, ordered by value: deeper first; within a depth the default
    mode before the others; within a mode the runs in plan order (forward, then generate)."""
    steps = [
        Step(index, attrs.evolve(run, depths=(depth,)))
        for index, run in enumerate(plan)
        for depth in run.depths
    ]
    modes = [mode for mode in dict.fromkeys(run.mode for run in plan)]

    def value(step: Step) -> tuple[int, int, int]:
        depth = step.settings.depths[0]
        deeper_first = -(depth or 0)
        return (deeper_first, modes.index(step.settings.mode), step.run)

    return sorted(steps, key=value)
