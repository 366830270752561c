"""What one ``torchkiln bench`` run measures: the workload grid, the strategies, the presets'
numbers (docs/benchmarks.md says why each preset has the cells it has)."""

from __future__ import annotations

import importlib.util
from typing import Any

import attrs

from torchkiln.errors import TorchkilnError

STRATEGIES = (
    "eager", "full", "regional", "precompiled", "hierarchical", "accelerate", "tiered",
)  # fmt: skip
"""Every strategy the worker knows, in table order."""
COMPILED_STRATEGIES = frozenset(STRATEGIES) - {"eager"}

DEFAULT_MODEL = "llama"
DEFAULT_DEPTHS = (4, 8, 16, 32)
DEFAULT_BATCHES = (1, 4)
DEFAULT_SEQ = 128
WORKLOADS = ("forward", "train", "generate")
DEFAULT_NEW_TOKENS = 16
DTYPES = {
    "float32": "float32", "fp32": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16",
}  # fmt: skip
"""Accepted ``--dtype`` spellings and the torch dtype each one means."""
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""``torch.compile`` modes the bench passes on (``default`` is passed as ``None``)."""
CUDA_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})
PRESETS = ("quick", "default", "gpu")
EXIT_TARGET_MISSED = 3
"""``torchkiln bench --check``'s exit status when every cell ran but a target is NOT met."""

# --quick (README's main job): the cells that fit its promised minutes on 2 CPU cores.
QUICK_DEPTHS = (4, 16)
QUICK_BATCHES = (1,)
QUICK_EVERY_DEPTH = ("full", "regional")
"""The contrast the story is about: full compile's first call grows with depth, regional's
stays flat."""
QUICK_DEEPEST_ONLY = ("precompiled", "tiered")
"""Run at the deepest quick depth only, where they differ most from full compile."""
QUICK_WARM = ("regional",)
"""The compiled strategies whose warm start is measured (each warm run costs a process)."""
QUICK_STEADY_DEEPEST_ONLY = True
"""Time the steady state at the deepest quick depth only (one steady-state process)."""
QUICK_STEADY_ITERS = 10
QUICK_WARMUP_ITERS = 2

# --preset gpu: one CUDA GPU (torchkiln.bench.plan.gpu_plan builds its runs).
GPU_MODEL = "llama-1b"
GPU_DEPTHS = (32, 16)
"""Deepest first: depth 32 is where the strategies differ most."""
GPU_BATCHES = (1,)
GPU_DTYPE = "bfloat16"
GPU_MODES: tuple[str | None, ...] = (None, "reduce-overhead")
"""``None`` is torch.compile's default mode."""
GPU_WORKLOADS = ("forward", "generate")
GPU_STRATEGIES = ("eager", "full", "regional", "tiered", "accelerate")
"""hierarchical and precompiled are left out to fit the budget; ``--strategies`` adds them
back. On a torch without ``aot_compile`` the preset leaves ``tiered`` out and says why."""
GPU_STEADY_ITERS = {"forward": 20, "generate": 10}
GPU_BUDGET_MINUTES = 8.0
GPU_JSON = "bench-gpu.json"
GPU_PLOT = "bench-gpu.png"
GPU_TIMEOUT = 420.0
"""One worker process at most (a full compile of depth 32 under reduce-overhead included)."""

# --ranks N (torchkiln.bench.jobs): the job's distributed strategy.
JOB_DISTRIBUTED = ("ddp", "fsdp2")
"""``--distributed`` choices, the default first. Under fsdp2 the bench leaves out the full
``torch.compile`` job and the tiered one (tiered compilation is refused under FSDP2)."""


class BenchError(TorchkilnError):
    """A ``torchkiln bench`` request that cannot run as given."""


def accelerate_available() -> bool:
    return importlib.util.find_spec("accelerate") is not None


def default_strategies(backend: str = "inductor") -> tuple[str, ...]:
    """Every strategy that can run here (``accelerate`` only when it is installed,
    ``precompiled`` only with a backend that declares it can be precompiled)."""
    return tuple(
        s
        for s in STRATEGIES
        if (s != "accelerate" or accelerate_available())
        and (
            s not in RELEASE_FEATURES
            or (backend_precompiles(backend) and release_problem(s) is None)
        )
    )


RELEASE_FEATURES = {"precompiled": "precompiled artifacts", "tiered": "tiered compilation"}
"""Strategies some supported torch releases lack, and the feature they need; both need a
backend that can be precompiled, too."""


def release_problem(name: str) -> str | None:
    """Why this torch cannot run strategy ``name`` (``None``: it can)."""
    from torchkiln._internals.versions import feature_problem

    feature = RELEASE_FEATURES.get(name)
    return feature_problem(feature) if feature is not None else None


def _declared_backend(backend: str) -> Any:
    from torchkiln.plugin_host.default_manager import get_plugin_manager

    return get_plugin_manager().ensure_loaded().backends().get(backend.lower())


def backend_precompiles(backend: str) -> bool:
    """Whether ``backend`` declares ``BackendSpec.precompile``."""
    declared = _declared_backend(backend)
    return declared is not None and bool(getattr(declared.spec, "precompile", False))


@attrs.frozen
class Cell:
    """One point of the grid: a model at one depth and batch size, under one strategy."""

    depth: int | None
    """``None`` for a ``package.module:factory`` model run without ``--depths``."""
    batch: int
    strategy: str

    @property
    def label(self) -> str:
        depth = f"depth {self.depth} " if self.depth is not None else ""
        return f"{depth}batch {self.batch} {self.strategy}"


@attrs.frozen
class BenchSettings:
    """Everything a bench run needs, validated."""

    model: str = DEFAULT_MODEL
    """A built-in example name (``llama``, ``gpt2``, ``toy``) or ``package.module:factory``."""
    depths: tuple[int | None, ...] = DEFAULT_DEPTHS
    batches: tuple[int, ...] = DEFAULT_BATCHES
    seq: int = DEFAULT_SEQ
    strategies: tuple[str, ...] = attrs.Factory(default_strategies)
    backend: str = "inductor"
    train: bool = False
    """Measure forward+backward instead of forward only (``workload == "train"``)."""
    workload: str = "forward"
    """``forward``, ``train`` or ``generate`` (see :data:`WORKLOADS`)."""
    new_tokens: int = DEFAULT_NEW_TOKENS
    """Tokens each ``generate`` call produces (the ``generate`` workload only)."""
    device: str = "cpu"
    steady_iters: int = 30
    """Timed calls for the steady-state median (after warm-up)."""
    warmup_iters: int = 3
    warm: bool = True
    """Also run each compiled cell a second time, reusing its cache directory."""
    timeout: float = 1800.0
    """Seconds one worker process may run before it is stopped and reported as failed."""
    preset: str = "default"
    dtype: str = "float32"
    """The model's parameter dtype (``float32``, ``bfloat16`` or ``float16``)."""
    mode: str | None = None
    """``torch.compile`` mode for every compiled strategy; ``None`` is torch's default."""
    dispatch: str | None = None
    """Always ``None`` (the removed ``--dispatch``); kept for the JSON documents' ``settings``."""
    steady_in_first_call: bool = False
    """Time the steady state in the first-call process (after its warm-up calls) instead of
    a shared steady-state process per depth and batch: half the processes and compiles, at
    the cost of strategies not sharing the machine's load alike (fine on a dedicated GPU)."""
    deepest_only: tuple[str, ...] = ()
    """Strategies run at the deepest of ``depths`` only (the quick preset's)."""
    warm_strategies: tuple[str, ...] | None = None
    """The compiled strategies that get a warm run (``None``: all of them, when ``warm``)."""
    steady_deepest_only: bool = False
    """Time the steady state at the deepest of ``depths`` only (the quick preset's)."""

    @property
    def deepest(self) -> int | None:
        return max((d for d in self.depths if d is not None), default=None)

    def cells(self) -> list[Cell]:
        return [
            Cell(depth, batch, strategy)
            for depth in self.depths
            for batch in self.batches
            for strategy in self.strategies
            if strategy not in self.deepest_only or depth == self.deepest
        ]

    def times_steady(self, depth: int | None) -> bool:
        """Whether the cells at ``depth`` get a shared steady-state run."""
        if self.steady_in_first_call:
            return False
        return not self.steady_deepest_only or depth == self.deepest

    def runs_warm(self, strategy: str) -> bool:
        """Whether ``strategy``'s cells get a warm run after the cold one."""
        if not self.warm or strategy not in COMPILED_STRATEGIES:
            return False
        return self.warm_strategies is None or strategy in self.warm_strategies

    def to_dict(self) -> dict[str, object]:
        return attrs.asdict(self)


def _positive_ints(text: str, option: str) -> tuple[int, ...]:
    values = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise BenchError(
                f"{option} {text!r}: expected comma-separated whole numbers >= 1, such as 4,16"
            )
        values.append(int(part))
    return tuple(dict.fromkeys(values))


def parse_strategies(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(s.strip().lower() for s in text.split(",") if s.strip()))
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown or not names:
        raise BenchError(
            f"--strategies {text!r}: unknown {', '.join(unknown) or '(empty)'}; "
            f"choose from {', '.join(STRATEGIES)}"
        )
    if "accelerate" in names and not accelerate_available():
        raise BenchError(
            "--strategies includes accelerate, but accelerate is not installed "
            "(pip install 'torchkiln[accelerate]')"
        )
    return tuple(s for s in STRATEGIES if s in names)


def _model_depths(
    model: str, depths: str | None, quick: bool
) -> tuple[str, tuple[int | None, ...]]:
    """Split ``NAME:DEPTH`` and decide the depths to run."""
    from torchkiln.examples import EXAMPLES

    name, _, arg = model.partition(":")
    builtin = name in EXAMPLES
    if builtin and arg:
        if not arg.isdigit() or int(arg) < 1:
            raise BenchError(f"--model {model!r}: the depth after ':' must be a whole number >= 1")
        if depths is not None:
            raise BenchError(
                f"--model {model!r} already fixes the depth; drop --depths or use --model {name}"
            )
        return name, (int(arg),)
    if not builtin and not arg:
        raise BenchError(
            f"--model {model!r} is neither a built-in example ({', '.join(sorted(EXAMPLES))}, "
            "optionally NAME:DEPTH) nor 'package.module:factory'"
        )
    if depths is not None:
        return model, _positive_ints(depths, "--depths")
    if not builtin:
        return model, (None,)  # the factory's own default size
    return model, QUICK_DEPTHS if quick else DEFAULT_DEPTHS


def _check_sizes(depths: tuple[int | None, ...], batches: tuple[int, ...], seq: int) -> None:
    """Depths and ``batch x seq`` that cannot be built are refused before any worker starts."""
    from torchkiln.examples import MAX_DEPTH, MAX_TOKENS

    deepest = max((d for d in depths if d is not None), default=1)
    if deepest > MAX_DEPTH:
        raise BenchError(f"depth {deepest}: at most {MAX_DEPTH}")
    if max(batches) * seq > MAX_TOKENS:
        raise BenchError(
            f"--batch {max(batches)} --seq {seq}: {max(batches) * seq} tokens; at most "
            f"{MAX_TOKENS} per call"
        )


def make_settings(
    *,
    model: str = DEFAULT_MODEL,
    quick: bool = False,
    depths: str | None = None,
    batch: str | None = None,
    seq: int = DEFAULT_SEQ,
    strategies: str | None = None,
    backend: str = "inductor",
    train: bool = False,
    device: str = "cpu",
    steady_iters: int | None = None,
    warm: bool = True,
    timeout: float = 1800.0,
    workload: str | None = None,
    new_tokens: int = DEFAULT_NEW_TOKENS,
    dtype: str = "float32",
    mode: str | None = None,
    check_device: bool = True,
) -> BenchSettings:
    """Validate command-line style values into :class:`BenchSettings`.

    ``quick`` without ``strategies`` runs the quick preset's cells (see
    the ``QUICK_`` numbers); ``steady_iters=None`` is the preset's number.

    :raises BenchError: naming the bad option and what is allowed.
    """
    model, depth_list = _model_depths(model, depths, quick)
    batches = (
        _positive_ints(batch, "--batch") if batch else (QUICK_BATCHES if quick else DEFAULT_BATCHES)
    )
    if seq < 1:
        raise BenchError(f"--seq {seq}: must be >= 1")
    if steady_iters is None:
        steady_iters = QUICK_STEADY_ITERS if quick else 30
    _check_sizes(depth_list, batches, seq)
    if steady_iters < 1:
        raise BenchError(f"--steady-iters {steady_iters}: must be >= 1")
    if timeout <= 0:
        raise BenchError(f"--timeout {timeout}: must be > 0 seconds")
    device = _check_device(device, check_device)  # the argument hides check_device
    mode = check_mode(mode, device)
    check_backend_mode(backend, mode)
    chosen = parse_strategies(strategies) if strategies else default_strategies(backend)
    preset_cells = quick and not strategies
    if preset_cells:
        chosen = tuple(s for s in chosen if s in QUICK_EVERY_DEPTH + QUICK_DEEPEST_ONLY)
    for needs_artifacts in RELEASE_FEATURES:
        if needs_artifacts in chosen and not backend_precompiles(backend):
            raise BenchError(
                f"--strategies includes {needs_artifacts}, but backend {backend!r} cannot be "
                "precompiled (its BackendSpec does not declare precompile); use inductor or "
                "aot_eager"
            )
    workload = _check_workload(workload, train)
    if workload == "generate" and "precompiled" in chosen:
        if strategies:
            raise BenchError(
                "--strategies includes precompiled, which --workload generate cannot run: its "
                "precompile run writes one prefill call's artifacts, and the decode steps "
                "(other shapes) would not fit them; tiered compiles prefill and decode in its "
                "builder"
            )
        chosen = tuple(s for s in chosen if s != "precompiled")
    for name in chosen:
        problem = release_problem(name)
        if problem is not None:
            raise BenchError(f"--strategies {name}: {problem}")
    if new_tokens < 2:
        raise BenchError(
            f"--new-tokens {new_tokens}: must be >= 2 (a first token and a decode step)"
        )
    return BenchSettings(
        model=model,
        depths=depth_list,
        batches=batches,
        seq=seq,
        strategies=chosen,
        backend=backend.lower(),
        train=workload == "train",
        workload=workload,
        new_tokens=new_tokens,
        device=device,
        steady_iters=steady_iters,
        warm=warm,
        timeout=timeout,
        preset="quick" if quick else "default",
        dtype=check_dtype(dtype),
        mode=mode,
        deepest_only=QUICK_DEEPEST_ONLY if preset_cells else (),
        warm_strategies=QUICK_WARM if preset_cells else None,
        steady_deepest_only=QUICK_STEADY_DEEPEST_ONLY if preset_cells else False,
        warmup_iters=QUICK_WARMUP_ITERS if quick else 3,
    )


def check_backend_mode(backend: str, mode: str | None) -> None:
    """Refuse a mode the backend declares it does not take (before any cell runs)."""
    if mode is None:
        return
    declared = _declared_backend(backend)
    modes = None if declared is None else declared.spec.modes
    if modes is not None and mode not in modes:
        allowed = ", ".join(modes) or "none (leave --mode out)"
        raise BenchError(f"--mode {mode}: backend {backend!r} does not take it; allowed: {allowed}")


def check_dtype(dtype: str) -> str:
    """``--dtype`` as a torch dtype name (``bf16`` -> ``bfloat16``)."""
    name = DTYPES.get(dtype.lower())
    if name is None:
        raise BenchError(
            f"--dtype {dtype!r}: choose float32, bfloat16 or float16 (or fp32, bf16, fp16)"
        )
    return name


def check_mode(mode: str | None, device: str) -> str | None:
    """``--mode`` for torch.compile (``default`` -> ``None``).

    CUDA-graph modes are refused on CPU: torch would only warn and compile as ``default``, so
    the cells would be mislabelled.
    """
    if mode is None:
        return None
    mode = mode.lower()
    if mode not in MODES:
        raise BenchError(f"--mode {mode!r}: choose {', '.join(MODES)}")
    if mode in CUDA_GRAPH_MODES and device != "cuda":
        raise BenchError(
            f"--mode {mode} uses CUDA graphs, which need --device cuda; on {device} torch "
            "ignores them (with a warning) and the cells would measure the default mode. "
            "Use max-autotune-no-cudagraphs or default there"
        )
    return None if mode == "default" else mode


def _check_workload(workload: str | None, train: bool) -> str:
    if workload is None:
        return "train" if train else "forward"
    workload = workload.lower()
    if workload not in WORKLOADS:
        raise BenchError(f"--workload {workload!r}: choose {', '.join(WORKLOADS)}")
    if train and workload != "train":
        raise BenchError(f"--train with --workload {workload}: --train means --workload train")
    return workload


def check_device(device: str, available: bool = True) -> str:
    """``--device`` validated (``auto`` resolved); ``available=False`` skips asking torch
    whether a CUDA device is there."""
    import torch

    device = device.lower()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise BenchError(f"--device {device!r}: choose auto, cpu or cuda")
    if device == "cuda" and available and not torch.cuda.is_available():
        raise BenchError("--device cuda: torch sees no CUDA device here")
    return device


_check_device = check_device
"""For :func:`make_settings`, whose ``check_device`` argument hides the function."""
