"""What a bench run keeps of each cell (its workers' records, or why there are none), where
it ran (recorded with every result), the one writer of every JSON file the bench leaves
(results, worker records, the JSON documents), and the one launcher of a process that gets its
settings as JSON (``--store``, ``--ranks``, ``--lengths``)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs

from torchkiln.bench.settings import Cell
from torchkiln.files import write_atomic


def write_result(path: str | Path, document: Any) -> None:
    """Write ``document`` as JSON to a temporary file beside ``path``, then rename it: a reader
    (or a run killed mid-write) sees the previous complete file or the new one, never half."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(document, indent=1) + "\n")


def run_json_process(
    module: str, out: Path, settings: dict[str, Any], failed: str, env: dict[str, str],
    timeout: float | None = None, launcher: Sequence[str] = (),
) -> None:  # fmt: skip
    """``python [launcher] -m module OUT SETTINGS_JSON`` (read back by :func:`json_argv`), with
    ``env`` over this process's environment.

    :raises RuntimeError: ``failed`` and the end of its stderr, when it exits non-zero.
    """
    command = [sys.executable, *launcher, "-m", module, str(out), json.dumps(settings)]
    process = subprocess.run(
        command, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout
    )
    if process.returncode != 0:
        raise RuntimeError(f"{failed} failed:\n{process.stderr[-3000:]}")


def json_argv(argv: Sequence[str] | None) -> tuple[str, dict[str, Any]]:
    """In a process :func:`run_json_process` started: its output path and its settings."""
    args = argv or sys.argv
    return args[1], json.loads(args[2])


@attrs.define
class RunFailure:
    """Why one worker run produced no result."""

    run: str
    """``precompile``, ``cold``, ``warm`` or ``steady``."""
    returncode: int | None
    """``None`` when it was stopped for running past the timeout."""
    message: str
    stderr_tail: str


@attrs.define
class CellResult:
    """One cell's measurements (the workers' JSON) or its failure."""

    cell: Cell
    cold: dict[str, Any] | None = None
    warm: dict[str, Any] | None = None
    failure: RunFailure | None = None
    steady_samples: list[float] | None = None
    """This strategy's timed calls in the shared steady-state run of its depth and batch."""
    steady_failure: str | None = None
    precompile: dict[str, Any] | None = None
    """``precompiled`` cells: the precompile run's JSON (seconds, entries, skipped)."""
    skipped: str | None = None
    """Why the cell was not started (``time budget``); it has no numbers and no failure."""

    @property
    def ok(self) -> bool:
        return self.failure is None and self.cold is not None

    @property
    def cold_first_call(self) -> float | None:
        return self.cold["first_call_seconds"] if self.cold else None

    @property
    def warm_first_call(self) -> float | None:
        return self.warm["first_call_seconds"] if self.warm else None

    @property
    def steady(self) -> float | None:
        """Median steady-state call time (from the shared steady-state run)."""
        return statistics.median(self.steady_samples) if self.steady_samples else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "depth": self.cell.depth,
            "batch": self.cell.batch,
            "strategy": self.cell.strategy,
            "cold_first_call_seconds": self.cold_first_call,
            "warm_first_call_seconds": self.warm_first_call,
            "steady_median_seconds": self.steady,
            "steady_min_seconds": min(self.steady_samples) if self.steady_samples else None,
            "steady_seconds": self.steady_samples,
            "steady_failure": self.steady_failure,
            "cold": self.cold,
            "warm": self.warm,
            "failure": attrs.asdict(self.failure) if self.failure else None,
            "precompile": self.precompile,
            "skipped": self.skipped,
        }

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> CellResult:
        """Back from :meth:`to_dict`'s record."""
        failure = record.get("failure")
        return cls(
            Cell(record["depth"], record["batch"], record["strategy"]),
            cold=record.get("cold"),
            warm=record.get("warm"),
            failure=RunFailure(**failure) if failure else None,
            steady_samples=record.get("steady_seconds"),
            steady_failure=record.get("steady_failure"),
            precompile=record.get("precompile"),
            skipped=record.get("skipped"),
        )


_ISA_FLAGS = (("avx2", "avx2"), ("avx512f", "avx512"), ("amx_tile", "amx"))
"""``/proc/cpuinfo`` flags worth naming with the model (what inductor's CPU kernels use)."""


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name, with its family, model number and vector extensions when Linux
    says them (``/proc/cpuinfo``; virtual machines often name only "Intel(R) Xeon(R)
    Processor", and ratios between strategies differ between CPUs); else
    ``platform.processor()``."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.exists() else ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor says it for all
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    name = fields.get("model name")
    if not name:
        return platform.processor() or platform.machine()
    details = [f"{key} {fields[key]}" for key in ("cpu family", "model") if fields.get(key)]
    flags = set(fields.get("flags", "").split())
    details += [label for flag, label in _ISA_FLAGS if flag in flags]
    return f"{name} ({', '.join(details)})" if details else name


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def collect_environment(device: str) -> dict[str, Any]:
    import torch

    cuda = device.startswith("cuda") and torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "torchkiln": _version("torchkiln"),
        "transformers": _version("transformers"),
        "accelerate": _version("accelerate"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "device_name": torch.cuda.get_device_name() if cuda else cpu_model(),
        "cuda": torch.version.cuda,
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
