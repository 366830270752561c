"""``torchkiln bench``: cold start, warm start and steady state of eager, full ``torch.compile``,
torchkiln regional and hierarchical compilation (and accelerate's ``compile_regions``), each
cell in fresh processes with a fresh inductor cache.

``torchkiln.bench.cli.add_bench_parser`` adds the sub-command; :func:`run_bench_cells` runs a
:class:`BenchSettings` grid from Python.
"""

from torchkiln.bench.runner import CellResult, run_bench_cells
from torchkiln.bench.settings import BenchError, BenchSettings, Cell, make_settings

__all__ = ["BenchError", "BenchSettings", "Cell", "CellResult", "make_settings", "run_bench_cells"]
