"""Where a bench ran: versions, CPU/GPU, threads, load; recorded with every result."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


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
