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


def _figure(rows: int, height: float) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")  # files only; never opens a window
    import matplotlib.pyplot as plt

    return plt.subplots(rows, 2, figsize=(11, height * rows), squeeze=False)


def _panel(axis: Any, results: Sequence[CellResult], batch: int | None, value: str) -> bool:
    """Draw ``value`` (``first``: cold first call in s, ``steady``: in ms) against depth, one
    line per strategy, at ``batch``; whether anything was drawn."""
    series: dict[str, list[tuple[int, float]]] = {}
    for result in results:
        number = result.cold_first_call if value == "first" else result.steady
        cell = result.cell
        if result.ok and cell.batch == batch and cell.depth is not None and number is not None:
            series.setdefault(cell.strategy, []).append((cell.depth, number))
    scale, unit = (1.0, "seconds") if value == "first" else (1000.0, "milliseconds")
    for strategy, points in series.items():
        points.sort()
        axis.plot(
            [d for d, _ in points], [v * scale for _, v in points], marker="o", label=strategy
        )
    axis.set(xlabel="depth (blocks)", ylabel=unit)
    axis.set_xticks(sorted({r.cell.depth for r in results if r.cell.depth is not None}))
    axis.grid(True, alpha=0.3)
    if series:
        axis.legend()
    return bool(series)


PANELS = (("first", "first call, cold cache"), ("steady", "steady-state call"))
"""What each of a row's two panels shows: its value and its title."""


def write_plot(results: Sequence[CellResult], path: str | Path, title: str) -> Path:
    """Two panels for the smallest batch: cold first call (s) and steady state (ms) vs depth."""
    require_matplotlib()
    batches = sorted({r.cell.batch for r in results})
    if not batches:
        raise BenchError("--plot: no results to draw")
    figure, axes = _figure(1, 4.2)
    for axis, (value, kind) in zip(axes[0], PANELS, strict=True):
        _panel(axis, results, batches[0], value)
        axis.set_title(f"{kind} (batch {batches[0]})")
    return _save(figure, title, path)


def write_runs_plot(
    runs: Sequence[tuple[str, Sequence[CellResult]]], path: str | Path, title: str
) -> Path:
    """One row per run (its title, its results): cold first call (s) and steady state (ms)
    against depth, smallest batch. Cells that are missing (skipped, failed) are left out; a
    run with none measured gets an empty row that says so."""
    require_matplotlib()
    if not runs:
        raise BenchError("--plot: no results to draw")
    figure, axes = _figure(len(runs), 3.4)
    for (name, results), row in zip(runs, axes, strict=True):
        batches = sorted({r.cell.batch for r in results if r.ok})
        for axis, (value, kind) in zip(row, PANELS, strict=True):
            if not _panel(axis, results, batches[0] if batches else None, value):
                axis.text(
                    0.5, 0.5, "not measured", ha="center", va="center", transform=axis.transAxes
                )
            axis.set_title(f"{name}: {kind}")
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
