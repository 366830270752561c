"""Whether a tiered model's first call starts its builder (``tiered.when``).

A builder compiles the whole model in another process. Where it has cores of its own (the
model runs on an accelerator, whose steps leave the CPU mostly free; or a CPU process that
leaves a core free) it costs the foreground little and pays back once the switch comes. On
CPU cores the steps keep busy it slows every step several times and finishes late or never
(docs/tiered.md has the numbers). ``auto`` starts it only in the first case; the report says
why not, with the numbers it used.
"""

from __future__ import annotations

import os

import attrs
import torch
from torch import nn

from torchkiln.configuration.config import CompileConfig


@attrs.frozen
class Machine:
    """What the decision reads, measured at the first call."""

    device: str
    """The device type of the model's first parameter (``cpu``, ``cuda``, ...)."""
    cores: int
    """The CPU cores this process may run on (its affinity)."""
    threads: int
    """torch's intra-op threads: the cores one step keeps busy."""
    local_ranks: int
    """Processes of the job on this machine (``LOCAL_WORLD_SIZE``; 1 outside a job)."""

    @classmethod
    def now(cls, model: nn.Module) -> Machine:
        device = next((p.device.type for p in model.parameters()), "cpu")
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            cores = os.cpu_count() or 1
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        return cls(device, cores, torch.get_num_threads(), max(local, 1))


def core_left_free(config: CompileConfig, machine: Machine) -> bool:
    """Whether the builder has cores of its own: an accelerator's steps leave the CPU mostly
    free; on the CPU, the cores this process may use beyond its steps' threads (times the
    job's ranks on the machine) must number ``tiered.threads``."""
    if machine.device != "cpu":
        return True
    return machine.cores - machine.threads * machine.local_ranks >= config.tiered.threads


def builder_problem(config: CompileConfig, machine: Machine) -> str | None:
    """Why the first call should not start a builder (``None``: start it)."""
    when = config.tiered.when
    if when == "always":
        return None
    if when == "never":
        return "tiered.when is never"
    if core_left_free(config, machine):
        return None
    busy = machine.threads * machine.local_ranks
    needed = config.tiered.threads
    ranks = f" x {machine.local_ranks} ranks on this machine" if machine.local_ranks > 1 else ""
    return (
        f"tiered.when is auto and the model runs on the CPU: its steps use {busy} of the "
        f"{machine.cores} cores this process may use (torch.get_num_threads() = "
        f"{machine.threads}{ranks}), and a builder needs {needed} more (tiered.threads); on "
        "busy cores it slows every step several times and finishes late. Leave it a core "
        "(torch.set_num_threads), or set tiered.when: always (a foreground that idles between "
        "calls)"
    )
