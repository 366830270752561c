"""Per-region progress while the first (compiling) call runs.

The engine calls :func:`make_progress` once per ``torchkiln.compile`` and then, from the
first-call shim of each region, ``start``/``done``. Nothing here stays on the forward path
after a region's first call.
"""

from __future__ import annotations

from typing import Protocol

from torchkiln.config import CompileConfig
from torchkiln.regions import Region, RegionPlan


class ProgressObserver(Protocol):
    def start(self, region: Region, group_index: int, group_count: int) -> None: ...
    def done(self, region: Region, seconds: float, compiled: bool) -> None: ...


class NullProgress:
    def start(self, region: Region, group_index: int, group_count: int) -> None:
        pass

    def done(self, region: Region, seconds: float, compiled: bool) -> None:
        pass


def make_progress(config: CompileConfig, plan: RegionPlan) -> ProgressObserver:
    """Return the progress display for one compiled model (silent unless configured)."""
    return NullProgress()
