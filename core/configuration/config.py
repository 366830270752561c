"""``CompileConfig``: what to compile, with which backend, around which distributed engine.

The compile fields mirror ``torch.compile`` (``backend``, ``mode``, ``fullgraph``, ``dynamic``,
``options``, ``disable``); the rest is torchkiln's own. Values are layered by
:mod:`torchkiln.configuration.config_sources` and validated by :mod:`torchkiln.configuration.config_validation`.
"""

from __future__ import annotations

from typing import Any

import attrs

REGION_ERROR_POLICIES = ("raise", "eager")
REST_POLICIES = ("eager", "leaves")
PROGRESS_CHOICES = ("auto", "on", "off")
REMOVED_FIELDS = {
    "dispatch": (
        "'dispatch' was removed: a compiled region's calls always go through torch.compile's "
        "wrapper, torch's public path (its 'direct' and 'reduced' values saved under 2% of a "
        "step); remove the setting"
    ),
}
"""Top-level fields that were removed, and what to do: naming one is a ``ConfigError``."""
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


@attrs.frozen
class RegionsConfig:
    """How regions are selected (``regions:`` in YAML)."""

    strategy: str = attrs.field(default="auto", converter=_lower)
    """``auto`` (repeated blocks if any, else the whole model), ``repeated``, ``whole``,
    ``classes``, ``paths``, ``hierarchical``, or a name a plugin declared."""
    classes: tuple[str, ...] = ()
    """Class-name globs: the blocks for ``classes``; for ``repeated``, the block classes to use
    instead of the level torchkiln would choose."""
    paths: tuple[str, ...] = ()
    """Module-path globs (``model.layers.*``) for ``paths``."""
    exclude: tuple[str, ...] = ()
    """Module-path globs never compiled, whatever the strategy."""
    rest: str = attrs.field(default="eager", converter=_lower)
    """What happens outside the selected blocks: ``eager`` (left alone) or ``leaves`` (each
    leaf module with parameters, such as ``lm_head``, compiled on its own)."""
    min_repeats: int = 2
    """How many structurally identical modules make a repeated block."""
    options: dict[str, Any] = attrs.Factory(dict)
    """Options for a selector a third-party plugin provides."""


@attrs.frozen
class DDPConfig:
    """Keyword arguments passed to ``DistributedDataParallel`` (``distributed.ddp:``)."""

    find_unused_parameters: bool = False
    bucket_cap_mb: float | None = None
    broadcast_buffers: bool | None = None
    gradient_as_bucket_view: bool = False
    static_graph: bool = False


@attrs.frozen
class FSDP2MixedPrecision:
    """FSDP2's ``MixedPrecisionPolicy`` (``distributed.fsdp2.mixed_precision:``), by dtype name.

    All unset (the default): no policy is passed, parameters compute in their own dtype."""

    param_dtype: str | None = None
    """dtype the gathered parameters compute in (``bfloat16``, ``float16``, ...); the sharded
    parameters the optimizer updates keep theirs."""
    reduce_dtype: str | None = None
    """dtype of the gradient reduce-scatter; ``null``: ``param_dtype``."""
    output_dtype: str | None = None
    """dtype the forward's floating-point outputs are cast to; ``null``: left as computed."""
    cast_forward_inputs: bool = True
    """Cast each sharded module's floating-point inputs to ``param_dtype``."""

    def is_default(self) -> bool:
        return self == FSDP2MixedPrecision()


@attrs.frozen
class FSDP2Config:
    """Options of the FSDP2 strategy (``distributed.fsdp2:``)."""

    reshard_after_forward: bool = True
    replicate_degree: int = 1
    """HSDP: replicate across this many groups of ranks and shard within each, on a 2-D mesh
    ``(replicate_degree, world_size / replicate_degree)``; ``1``: shard across all ranks."""
    mixed_precision: FSDP2MixedPrecision = attrs.Factory(FSDP2MixedPrecision)
    activation_checkpointing: bool = False
    """Activation checkpointing of each block: ``torch.utils.checkpoint`` traced into the
    block's compiled code (every backend, inductor included; [Distributed](distributed.md))."""
    mesh_device: str | None = None
    """Device type of the device mesh; ``None`` picks it from the process group's backend
    (``cpu`` for gloo)."""
    dynamo_flags: bool = False
    """Turn on the Dynamo settings the FSDP2 + compile + checkpointing recipe needs
    (``capture_scalar_outputs``, ``skip_fwd_side_effects_in_bwd_under_checkpoint``) for the
    lifetime of the compiled model; :func:`torchkiln.decompile` restores them."""


@attrs.frozen
class DeepSpeedConfig:
    """Options of the DeepSpeed strategy (``distributed.deepspeed:``)."""

    config: dict[str, Any] | str | None = None
    """DeepSpeed's own configuration: a mapping, or the path of its JSON file."""


@attrs.frozen
class DistributedConfig:
    """Which distributed engine wraps the model (``distributed:`` in YAML)."""

    strategy: str = attrs.field(default="none", converter=_lower)
    """``none``, ``ddp``, ``fsdp2``, ``deepspeed``, or a name a plugin declared."""
    ddp: DDPConfig = attrs.Factory(DDPConfig)
    fsdp2: FSDP2Config = attrs.Factory(FSDP2Config)
    deepspeed: DeepSpeedConfig = attrs.Factory(DeepSpeedConfig)
    options: dict[str, Any] = attrs.Factory(dict)
    """Options for a strategy a third-party plugin provides."""


@attrs.frozen
class TieredConfig:
    """Tiered compilation (``tiered:`` in YAML; ``tiered=True`` as a keyword): the first
    calls run regionally while a builder process compiles the whole model, then the model
    switches to it in place between two calls (docs/tiered.md)."""

    enabled: bool = False
    """Serve the first calls regionally and switch to a whole-model form built in a builder
    process (docs/tiered.md); ``tiered: true`` and ``TORCHKILN_TIERED=1`` are shorthands."""
    threads: int = 1
    """CPU threads the builder may use (torch's intra-op threads and inductor's compile
    workers)."""
    when: str = attrs.field(default="auto", converter=_lower)
    """Whether the first call starts the builder. ``auto`` (the default): where it pays. On
    an accelerator, always; on the CPU, only when a core is left free for it (this process may
    use more cores than its training or serving threads and the job's other ranks on the
    machine take): a builder on the cores the steps use slows every step 3-4x and finishes late
    (docs/tiered.md, "When tiered pays"). ``always``: start it anyway (a foreground that idles
    between calls, as a server does). ``never``: start no builder; a whole-model form
    already in ``artifacts=`` or the store is still loaded and used, as with tiered off."""
    max_slowdown: float = 1.25
    """The most the builder may slow the foreground's mean step (a step: one root call's start
    to the next's). torchkiln measures it while building, pausing the builder for a couple of
    steps now and then; above the bound the builder runs only one step in several (a later
    switch, never a slower loop). 0: no bound, no pauses."""
    nice: int = 0
    """How much lower the builder's scheduling priority is than the user's process (0-19).
    On a machine whose cores the user's process keeps busy, any positive value can starve the
    builder (at 10 it gets about a tenth of a contended core): the switch then comes late."""


JOB_SHARE_CHOICES = ("auto", "on", "off")
TIERED_WHEN_CHOICES = ("auto", "always", "never")


@attrs.frozen
class JobConfig:
    """Compiling once per job under ``torch.distributed`` (``job:`` in YAML; docs/jobs.md)."""

    share: str = attrs.field(default="auto", converter=_lower)
    """``auto`` (the default): in a job of more than one rank, one rank compiles each region
    group and the others load what it compiled; where that cannot be (a torch before 2.13, a
    backend that cannot save its compiled code, a strategy other than none or ddp) every
    rank compiles its own and the report says why. ``on``: the same, and a job that cannot
    share raises instead. ``off``: every rank compiles its own."""
    timeout: float = 1800.0
    """Seconds a rank waits for another (to reach the same region group, or to send what it
    compiled) before it fails with a ``JobError`` naming that rank."""
    store: str | None = None
    """A directory that outlives the job: what a rank compiled is published there (written
    aside, then renamed into place), and a restarted job with the same key loads it on every
    rank and compiles nothing. Local to each node or shared by all; ``None``: no store."""


@attrs.frozen
class CompileConfig:
    """Everything :func:`torchkiln.compile` needs to know. Frozen; use ``attrs.evolve``."""

    backend: str = attrs.field(default="inductor", converter=_lower)
    """A registered backend name (``torchkiln plugins`` lists them) or any name torch knows;
    ``no`` turns compilation off. Case-insensitive."""
    mode: str | None = None
    """Passed to ``torch.compile``; checked against what the backend accepts."""
    fullgraph: bool = False
    dynamic: bool | None = None
    """``None`` is torch's automatic dynamic shapes (recompile once with symbolic sizes)."""
    options: dict[str, Any] = attrs.Factory(dict)
    """Backend options, as ``torch.compile(options=...)``."""
    disable: bool = False
    """Leave the model untouched (``torch.compile(disable=True)``)."""
    regions: RegionsConfig = attrs.Factory(RegionsConfig)
    distributed: DistributedConfig = attrs.Factory(DistributedConfig)
    tiered: TieredConfig = attrs.Factory(TieredConfig)
    job: JobConfig = attrs.Factory(JobConfig)
    on_region_error: str = attrs.field(default="raise", converter=_lower)
    """``raise``: a region that fails to compile raises. ``eager``: it runs eagerly, the
    others stay compiled, and :func:`torchkiln.report` says why."""
    store: str | None = None
    """The one directory everything a run compiles lands in, so that the next process, rank or
    node that names it starts from the best form it holds, with no extra step: inductor's
    kernels (``kernels/``, unless ``cache_dir`` is set), the region groups' entries
    (``entries/``, unless ``job.store`` is set) and, once tiered compilation's builder has
    finished, the whole-model form (``whole/``). Tiered compilation is on with a store unless
    ``tiered.enabled`` is set (``tiered.when`` decides whether a builder pays). Published
    atomically, safe with many writers; ``None``: nothing is kept (docs/store.md)."""
    cache_dir: str | None = None
    """Directory for persistent compile artifacts (inductor FX-graph and AOTAutograd
    caches); ``None`` leaves torch's own default."""
    remote_cache: str | None = None
    """A Redis URL (``redis://HOST:PORT``): torch's remote caches (inductor's compiled graphs
    and autotuning, AOTAutograd's graphs) on that server for the compiled model's lifetime, so
    that kernels reach jobs on fresh machines; ``None``: off (docs/cache.md)."""
    artifacts: str | None = None
    """Directory written by ``torchkiln precompile``: region groups whose artifacts fit are
    loaded from it instead of traced and compiled; ``None``: compile normally."""
    artifacts_strict: bool = False
    """Artifacts that do not fit (torch, backend, options, device, dtype, code, inputs) raise
    ``ArtifactError`` instead of a warning and a normal compile."""
    progress: str = attrs.field(default="auto", converter=_lower)
    """Per-region progress during the first (compiling) call: ``auto`` (only on a
    terminal), ``on``, ``off``."""
    report: bool = False
    """Print the compile report after the first compiled call."""

    @property
    def enabled(self) -> bool:
        """Whether anything will be compiled."""
        return not self.disable and self.backend != "no"
