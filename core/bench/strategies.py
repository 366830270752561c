"""In a worker process: the bench model and its inputs, each strategy applied to it, and one
timed call. Nothing here imports torch before it is called (the worker times that import)."""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import attrs

TORCHKILN_STRATEGIES = ("regional", "hierarchical", "precompiled", "tiered")


def first_tensor(output: Any) -> Any:
    """The main tensor of a model output (a tensor, ``ModelOutput.logits``, or element 0)."""
    import torch

    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, list | tuple) and output:
        return first_tensor(output[0])
    raise TypeError(f"cannot find a tensor in the model output ({type(output).__name__})")


def build(args: argparse.Namespace) -> tuple[Any, Any]:
    """The model (in ``args.dtype`` on ``args.device``, in train mode for ``--train``) and its
    inputs; a custom model module may say how to feed it: ``example_inputs(model, batch, seq)``."""
    import torch

    from torchkiln.examples import BUILDS_ON_DEVICE, example_inputs, load_model

    kwargs: dict[str, Any] = {"depth": args.depth} if args.depth is not None else {}
    dtype = getattr(torch, args.dtype)
    name, _, factory = args.model.partition(":")
    if name in BUILDS_ON_DEVICE:
        # Built where it runs, in its dtype: no float32 copy on the CPU first.
        model = load_model(args.model, device=args.device, dtype=dtype, **kwargs)
    else:
        model = load_model(args.model, **kwargs).to(device=args.device, dtype=dtype)
    model.train(args.train)
    make_inputs = example_inputs
    if factory and not factory.isdigit():
        make_inputs = getattr(importlib.import_module(name), "example_inputs", example_inputs)
    inputs = make_inputs(model, args.batch, args.seq)
    return model, inputs.to(args.device) if hasattr(inputs, "to") else inputs


@attrs.frozen
class Strategies:
    """How this worker applies each strategy: the backend and mode of every compiled one, and
    the artifact directories of ``precompiled`` and ``tiered``."""

    backend: str
    mode: str | None = None
    artifacts: str | None = None
    tiered_artifacts: str | None = None

    @classmethod
    def of(cls, args: argparse.Namespace) -> Strategies:
        return cls(args.backend, args.mode, args.artifacts, args.tiered_artifacts)

    def config(self, strategy: str) -> Any:
        """A complete CompileConfig: no YAML file or TORCHKILN_* variable can change the cell.
        ``precompiled`` loads strictly: artifacts that do not fit fail the cell rather than
        compile normally and pass for loaded. ``tiered``'s builder publishes into the store
        :attr:`tiered_artifacts`; a run that finds the whole-model form there starts from it."""
        from torchkiln.configuration.config import (
            CompileConfig,
            JobConfig,
            RegionsConfig,
            TieredConfig,
        )

        extra: dict[str, Any] = {}
        if strategy == "precompiled":
            extra = {"artifacts": self.artifacts, "artifacts_strict": True}
        if strategy == "tiered":
            # The cell measures how soon the tiered form can switch: the builder starts
            # whatever tiered.when's auto would decide here, and is not paused for the calls it
            # slows (docs/benchmarks.md says so); the training bench (--lengths) measures the
            # defaults.
            extra["tiered"] = TieredConfig(enabled=True, when="always", max_slowdown=0)
            if self.tiered_artifacts:  # the whole-model form only: no region entries, and
                # the kernels stay in the cell's cache directory, as without a store
                extra["store"] = self.tiered_artifacts
                extra["job"] = JobConfig(share="off")
                extra["cache_dir"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        selector = "hierarchical" if strategy == "hierarchical" else "auto"
        return CompileConfig(
            backend=self.backend,
            mode=self.mode,
            regions=RegionsConfig(strategy=selector),
            progress="off",
            **extra,
        )

    def apply(self, strategy: str, model: Any) -> Any:
        """The callable to measure; compilation itself stays lazy (first call)."""
        import torch

        if strategy == "eager":
            return model
        if strategy == "full":
            return torch.compile(model, backend=self.backend, mode=self.mode)
        if strategy in TORCHKILN_STRATEGIES:
            import torchkiln

            if strategy == "precompiled" and not self.artifacts:
                raise SystemExit("the precompiled strategy needs --artifacts DIR")
            return torchkiln.compile(model, self.config(strategy))
        if strategy == "accelerate":
            from accelerate.utils import compile_regions

            return compile_regions(model, backend=self.backend, mode=self.mode)
        raise SystemExit(f"unknown strategy {strategy!r}")

    def generation_target(self, strategy: str, model: Any) -> Any:
        """The module whose ``generate`` is timed: full compile is applied in place
        (``model.compile()``), as ``torch.compile(model)``'s wrapper would generate with the
        original, uncompiled forward."""
        if strategy == "full":
            model.compile(backend=self.backend, mode=self.mode)
            return model
        return self.apply(strategy, model)


def step(fn: Any, model: Any, inputs: Any, train: bool) -> Callable[[], Any]:
    """One call of ``fn``: a forward under ``no_grad``, or forward and backward (``train``)."""
    import torch

    def forward() -> Any:
        with torch.no_grad():
            return fn(inputs)

    def forward_backward() -> Any:
        model.zero_grad(set_to_none=True)  # as a training step would, so grads never pile up
        output = fn(inputs)
        first_tensor(output).float().mean().backward()
        return output

    return forward_backward if train else forward


def eager_reference(strategy: str, model: Any, inputs: Any, compiled_out: Any) -> float:
    """Largest absolute difference between the compiled first output and eager."""
    import torch

    if strategy in TORCHKILN_STRATEGIES:
        import torchkiln

        torchkiln.decompile(model)
    # full and accelerate leave the original module untouched (they return new objects).
    with torch.no_grad():
        reference = first_tensor(model(inputs)).float()
    return float((compiled_out.float() - reference).abs().max().item())


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def synced(call: Callable[[], Any], device: str) -> Callable[[], Any]:
    """``call`` that returns only once ``device`` has finished its work."""

    def run() -> Any:
        result = call()
        _sync(device)
        return result

    return run


def timed(call: Callable[[], Any], device: str) -> tuple[float, Any]:
    """``call()``'s seconds, ``device`` synchronised before and after, and its result."""
    _sync(device)
    started = time.perf_counter()
    result = synced(call, device)()
    return time.perf_counter() - started, result


def alternate_rounds(
    calls: dict[str, Callable[[], float]], rounds: int, rotate: bool = False,
    after_round: Callable[[int], None] = lambda _index: None,
) -> dict[str, list[float]]:  # fmt: skip
    """What each of ``calls`` returns (its seconds), each called once per round for ``rounds``
    rounds, so that a burst of load lands on all alike; ``rotate`` starts each round one call
    later (nobody always goes first). ``after_round`` gets the index of each round done."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    for index in range(rounds):
        shift = index % len(order) if rotate and order else 0
        for name in order[shift:] + order[:shift]:
            samples[name].append(calls[name]())
        after_round(index)
    return samples


TIERED_TIMEOUT_SECONDS = 1800.0
"""A ``tiered`` builder still running after this long is reported as not having switched."""


def until_whole_model(
    step: Callable[[], Any],
    model: Any,
    started: float,
    clock: Callable[[], float],
    figured: bool = False,
) -> dict[str, Any]:
    """The ``tiered`` cell's own figures: call ``step`` back to back (as a training or serving
    loop would) until the model serves from the whole-model tier (or it never will).

    ``seconds_to_whole_model`` runs from ``started`` (the first call's start) to the end of
    the first call the whole-model form served; ``steady_before_switch_seconds`` is the median
    call while the builder compiled: what ``step`` returns when ``figured`` (the generate
    workload: the median time per decoded token, as its steady state is), else its time."""
    import torchkiln.tiered

    during: list[float] = []
    served_whole = None
    while clock() - started < TIERED_TIMEOUT_SECONDS:
        before = torchkiln.tiered.tiers(model)
        began = clock()
        result = step()
        ended = clock()
        after = torchkiln.tiered.tiers(model)
        if after.calls["whole-model"] > before.calls["whole-model"]:
            served_whole = ended
            break
        if after.state == "failed":
            break
        if before.state == "pending" and before.builds:  # building
            during.append(result if figured else ended - began)
    tiers = torchkiln.tiered.tiers(model)
    return {
        "seconds_to_whole_model": served_whole - started if served_whole else None,
        "steady_before_switch_seconds": statistics.median(during) if during else None,
        "calls_before_switch": tiers.calls["regional"],
        "state": tiers.state,
        "reason": tiers.reason,
        "build_seconds": tiers.build_seconds,
        "builder_peak_rss_mb": tiers.builder_peak_rss_mb,
        "load_seconds": tiers.load_seconds,
    }


def switched(step: Callable[[], Any], model: Any) -> Callable[[], Any]:
    """``step`` after the model has switched (the steady-state run times the whole-model
    tier); raises when it cannot switch, so the cell reports why."""
    import torchkiln.tiered

    for _ in range(3):
        step()
        if torchkiln.tiered.tiers(model).builds:  # no longer only observing
            break
    torchkiln.tiered.wait(model, TIERED_TIMEOUT_SECONDS)
    step()
    tiers = torchkiln.tiered.tiers(model)
    if tiers.serving != "whole-model":
        raise RuntimeError(f"tiered did not switch: {tiers.state}: {tiers.reason}")
    return step
