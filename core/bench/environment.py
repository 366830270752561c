"""Where a bench ran: versions, CPU/GPU, threads, load; recorded with every result."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

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
