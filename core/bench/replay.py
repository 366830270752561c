"""``torchkiln bench --from-json FILE``: the tables, targets and plot of a run already written,
also one that was stopped before its end (its JSON is rewritten after every cell)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchkiln.bench.presets import mode_name
from torchkiln.bench.results import CellResult
from torchkiln.bench.settings import EXIT_TARGET_MISSED, BenchError
from torchkiln.bench.table import render_all
from torchkiln.bench.targets import Target, check_targets, missed


def exit_status(failed: bool, targets: list[Target], check: bool) -> int:
    """1 when a cell failed; else, with ``check``, 3 when a target is NOT met; else 0."""
    if failed:
        return 1
    return EXIT_TARGET_MISSED if check and missed(targets) else 0


def load_runs(
    path: str | Path,
) -> tuple[dict[str, Any], list[tuple[dict[str, Any], list[CellResult]]]]:
    """The document and its runs, each ``(settings, results)``.

    :raises BenchError: when the file is missing or is not a bench JSON document.
    """
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise BenchError(
            f"--from-json {path}: cannot read a bench JSON document: {error}"
        ) from error
    if not isinstance(document, dict) or "torchkiln_bench" not in document:
        raise BenchError(f"--from-json {path}: not written by torchkiln bench --json")
    runs = document.get("runs") or [document]
    return document, [
        (run["settings"], [CellResult.from_dict(c) for c in run["cells"]]) for run in runs
    ]


def replay(path: str, plot_path: str | None, *, check: bool = False) -> int:
    """Print the tables and targets of ``path``; draw ``plot_path`` when given. 0 unless a
    cell in it failed (1), or, with ``check``, a target is NOT met (3)."""
    document, runs = load_runs(path)
    environment = document.get("environment", {})
    several = len(runs) > 1
    judged = []
    for settings, results in runs:
        title = f"=== {settings['workload']}, mode {mode_name(settings.get('mode'))} ===\n"
        targets = check_targets(results, settings.get("workload", "forward"))
        judged += targets
        print((title if several else "") + render_all(settings, environment, results, targets))
        print()
    if not document.get("complete", True):
        print(f"{path}: the run stopped before its end; these are the cells it finished")
    if plot_path:
        from torchkiln.bench.plot import write_runs_plot

        panels = [
            (f"{s['workload']}, mode {mode_name(s.get('mode'))}", results) for s, results in runs
        ]
        first = runs[0][0]
        write_runs_plot(
            panels,
            plot_path,
            f"torchkiln bench: {first['model']}, {first.get('dtype', 'float32')}, backend {first['backend']}",
        )
        print(f"wrote {plot_path}")
    failed = any(r.failure is not None for _, results in runs for r in results)
    return exit_status(failed, judged, check)
