"""Compiling once per job (docs/jobs.md): under ``torch.distributed``, one rank compiles each
distinct region group and the others load what it compiled; with ``job.store``, a restarted job
loads everything and compiles nothing.

:func:`job_share_for` decides, at :func:`torchkiln.compile`, whether this model's groups are
shared, and why not; :mod:`torchkiln.jobs.share` does the sharing at each group's first call.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from torchkiln._internals.versions import feature_problem
from torchkiln.configuration.config import CompileConfig
from torchkiln.errors import JobError
from torchkiln.jobs.exchange import job_world
from torchkiln.jobs.share import JobReport, JobShare

SHARED_STRATEGIES = ("none", "ddp", "deepspeed", "fsdp2")
"""Distributed strategies under which ranks share compiled groups. Under DeepSpeed ZeRO-3 the
gathering hooks split each block, so the rank that compiles for sharing fails at the first
split and every rank compiles normally (the report says so)."""

THROUGH_CACHES = ("fsdp2",)
"""Strategies a caller shards with *after* torchkiln compiled (:func:`sharded_after_compile`:
Accelerate's FSDP2 ``prepare``) whose groups are shared through torch's caches, not as saved
functions: the rank that compiles the entry runs what it compiled, the others put the entry's
kernels in their inductor cache and compile normally, hitting it (Dynamo's trace, no inductor
compile). There the saved functions of the leaf groups Accelerate compiles did not fit their
calls (measured: "2 of 2 calls did not fit it"). Under torchkiln's own ``fsdp2`` (and HSDP)
groups are shared as saved functions: the load keeps each block's ``fully_shard`` class
(:func:`torchkiln._internals.fsdp.fsdp_classes_kept`; docs/jobs.md, "Two ways to share")."""


_SHARDED_AFTER: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "torchkiln_sharded_after_compile", default=None
)


@contextlib.contextmanager
def sharded_after_compile(strategy: str) -> Iterator[None]:
    """Compiles inside this block are of a model that its caller wraps with ``strategy``
    afterwards, itself (Accelerate's FSDP2 ``prepare``: ``compile_regions_fsdp2``, then
    ``fully_shard``): torchkiln's own strategy is ``none``, and the groups are shared through
    torch's caches (:data:`THROUGH_CACHES`, :func:`share_way`)."""
    token = _SHARDED_AFTER.set(strategy)
    try:
        yield
    finally:
        _SHARDED_AFTER.reset(token)


def share_way(config: CompileConfig) -> str:
    """How this job's groups are shared: ``caches`` for a compile inside
    :func:`sharded_after_compile` (:data:`THROUGH_CACHES`), else ``function``."""
    return "caches" if _SHARDED_AFTER.get() in THROUGH_CACHES else "function"


def sharing_problem(config: CompileConfig, plan: Any, plugins: Any) -> str | None:
    """Why this job's ranks cannot share compiled groups, or ``None`` when they can."""
    if config.job.share == "off":
        return "job.share is off"
    if config.artifacts is not None:
        return "artifacts= serves the groups (a precompiled directory)"
    missing = feature_problem("precompiled artifacts")
    if missing is not None:
        return missing
    declared = plugins.backend(config.backend)
    if declared is None or not getattr(declared.spec, "precompile", False):
        return (
            f"backend {config.backend!r} does not declare that its compiled code can be saved "
            "and loaded (BackendSpec.precompile)"
        )
    if plan.nested:
        return "a nested (hierarchical) plan is one Dynamo frame, not groups to share"
    strategy = config.distributed.strategy
    if strategy not in SHARED_STRATEGIES:
        return (
            f"distributed strategy {strategy!r}: compiled groups are shared under "
            f"{', '.join(SHARED_STRATEGIES)} only (docs/jobs.md)"
        )
    return None


def job_share_for(
    config: CompileConfig, plan: Any, plugins: Any, progress: bool
) -> tuple[JobShare | None, JobReport | None]:
    """The sharing for one compiled model: a :class:`JobShare` (and no report yet), or no share
    and a report saying why (``None`` for both outside a job with no store).

    :raises JobError: ``job.share`` is ``on`` and the job cannot share.
    """
    rank, world = job_world()
    if world == 1 and config.job.store is None:
        return None, None
    problem = sharing_problem(config, plan, plugins)
    if problem is None:
        return JobShare(config, progress, share_way(config)), None
    if config.job.share == "on":
        raise JobError(f"job.share is on, but this job cannot share compiled groups: {problem}")
    return None, JobReport(rank, world, False, problem, config.job.store)


__all__ = [
    "JobReport",
    "JobShare",
    "job_share_for",
    "sharded_after_compile",
    "share_way",
    "sharing_problem",
]
