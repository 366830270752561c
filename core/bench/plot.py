"""``--plot FILE.png``: first-call time against depth, and steady-state time, per strategy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchkiln.bench.results import CellResult
from torchkiln.bench.settings import BenchError


def require_matplotlib() -> None:
    """Fail before any cell runs when ``--plot`` cannot be honoured."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise BenchError(
            "--plot needs matplotlib, which is not installed: pip install 'torchkiln[bench]' "
            "(or drop --plot)"
        ) from error


def _series(
    results: Sequence[CellResult], batch: int, value: str
) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for result in results:
        if result.ok and result.cell.batch == batch and result.cell.depth is not None:
            number = result.cold_first_call if value == "first" else result.steady
            if number is not None:
                series.setdefault(result.cell.strategy, []).append((result.cell.depth, number))
    return series


def write_plot(results: Sequence[CellResult], path: str | Path, title: str) -> Path:
    """Two panels for the smallest batch: cold first call (s) and steady state (ms) vs depth."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only; never opens a window
    import matplotlib.pyplot as plt

    batches = sorted({r.cell.batch for r in results})
    if not batches:
        raise BenchError("--plot: no results to draw")
    batch = batches[0]
    figure, (first_axis, steady_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    for strategy, points in _series(results, batch, "first").items():
        points.sort()
        first_axis.plot([d for d, _ in points], [v for _, v in points], marker="o", label=strategy)
    for strategy, points in _series(results, batch, "steady").items():
        points.sort()
        steady_axis.plot(
            [d for d, _ in points], [v * 1000 for _, v in points], marker="o", label=strategy
        )
    first_axis.set(
        title=f"first call, cold cache (batch {batch})", xlabel="depth (blocks)", ylabel="seconds"
    )
    steady_axis.set(
        title=f"steady-state call (batch {batch})", xlabel="depth (blocks)", ylabel="milliseconds"
    )
    depths = sorted({r.cell.depth for r in results if r.cell.depth is not None})
    for axis in (first_axis, steady_axis):
        axis.set_xticks(depths)
        axis.grid(True, alpha=0.3)
        if axis.get_legend_handles_labels()[0]:  # nothing measured (a stopped run): no legend
            axis.legend()
    return _save(figure, title, path)


def write_runs_plot(
    runs: Sequence[tuple[str, Sequence[CellResult]]], path: str | Path, title: str
) -> Path:
    """One row per run (its title, its results): cold first call (s) and steady state (ms)
    against depth, smallest batch. Cells that are missing (skipped, failed) are left out; a
    run with none measured gets an empty row that says so."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only; never opens a window
    import matplotlib.pyplot as plt

    if not runs:
        raise BenchError("--plot: no results to draw")
    figure, axes = plt.subplots(len(runs), 2, figsize=(11, 3.4 * len(runs)), squeeze=False)
    for (name, results), (first_axis, steady_axis) in zip(runs, axes, strict=True):
        batches = sorted({r.cell.batch for r in results if r.ok})
        for axis, value, unit, scale in (
            (first_axis, "first", "seconds", 1.0),
            (steady_axis, "steady", "milliseconds", 1000.0),
        ):
            series = _series(results, batches[0], value) if batches else {}
            for strategy, points in series.items():
                points.sort()
                axis.plot(
                    [d for d, _ in points], [v * scale for _, v in points], marker="o",
                    label=strategy,
                )  # fmt: skip
            kind = "first call, cold cache" if value == "first" else "steady-state call"
            axis.set(title=f"{name}: {kind}", xlabel="depth (blocks)", ylabel=unit)
            depths = sorted({r.cell.depth for r in results if r.cell.depth is not None})
            axis.set_xticks(depths)
            axis.grid(True, alpha=0.3)
            if series:
                axis.legend()
            else:
                axis.text(0.5, 0.5, "not measured", ha="center", va="center",
                          transform=axis.transAxes)  # fmt: skip
    return _save(figure, title, path)


def _save(figure: Any, title: str, path: str | Path) -> Path:
    """Title, lay out, write and close ``figure``."""
    import matplotlib.pyplot as plt

    figure.suptitle(title)
    figure.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=110)
    plt.close(figure)
    return target
