"""Tiered compilation: the first calls served regionally, then the whole model compiled in
another process and switched to in place between two calls (docs/tiered.md).

``torchkiln.compile(model, tiered=True)`` turns it on; :func:`wait` and :func:`tiers` let a
program (a benchmark, a test, a server warming up) wait for the switch and read where it
stands. :func:`torchkiln.report` shows the same in its ``tiers`` lines.
"""

from __future__ import annotations

from typing import Any


def _runtime(model: Any) -> Any:
    from torchkiln.distributed import distributed_result
    from torchkiln.engine.compile_state import state_of

    result = distributed_result(model)
    state = state_of(result.module if result is not None else model)
    return state.tiered if state is not None else None


def tiers(model: Any) -> Any:
    """Where the tiers of ``model`` stand (a ``TierReport``), or ``None`` without tiers."""
    runtime = _runtime(model)
    return runtime.report() if runtime is not None else None


def wait(model: Any, timeout: float | None = None) -> bool:
    """Block until the builder of ``model`` has finished (at most ``timeout`` seconds).

    The switch itself happens at the start of the next call. Returns ``True`` when there is
    nothing left to wait for (built, failed, or never started), ``False`` on timeout. In a job,
    only rank 0 has a builder: other ranks return at once, and every rank switches at the next
    call after rank 0's builder finished.
    """
    runtime = _runtime(model)
    return True if runtime is None else runtime.build.wait(timeout)


__all__ = ["tiers", "wait"]
