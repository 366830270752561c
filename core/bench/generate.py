"""The ``generate`` workload of ``torchkiln bench`` (docs/benchmarks.md): a greedy
``model.generate()`` with the model's default KV cache, whose streamer notes when each token
comes out: the time to the first token is the workload's first call, the median gap between
later tokens its steady state. Full ``torch.compile`` is applied in place
(``Strategies.generation_target``)."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any


class TokenClock:
    """A transformers streamer (``put``/``end``) that only notes when tokens arrive.

    ``generate`` calls ``put`` once with the prompt, then once per generated token.
    """

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass

    def decode_gaps(self) -> list[float]:
        """Seconds between consecutive generated tokens (the decode steps)."""
        tokens = self.times[1:]
        return [later - earlier for earlier, later in itertools.pairwise(tokens)]


def generate_once(target: Any, inputs: Any, new_tokens: int) -> tuple[TokenClock, Any]:
    """One greedy ``generate`` of exactly ``new_tokens`` tokens."""
    import torch

    clock = TokenClock()
    with torch.no_grad():
        tokens = target.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            streamer=clock,
        )
    return clock, tokens


def tokens_differing(tokens: Any, reference: Any) -> int:
    """Generated ids that differ from eager's (0: identical)."""
    if tokens.shape != reference.shape:
        return int(max(tokens.numel(), reference.numel()))
    return int((tokens != reference).sum().item())


def first_token(args: Any) -> tuple[dict[str, Any], Any]:
    """Apply the strategy and time ``generate`` up to its first token, then the whole call; a
    few more calls catch later recompiles (the decode steps compile on the first call).
    Returns the record and the module that generated."""
    from torchkiln.bench.strategies import Strategies, build, until_whole_model

    model, inputs = build(args)
    started = time.perf_counter()
    target = Strategies.of(args).generation_target(args.strategy, model)
    clock, tokens = generate_once(target, inputs, args.new_tokens)
    finished = time.perf_counter()
    tiered = None
    if args.strategy == "tiered":
        per_token = steady_decode(target, inputs, args.new_tokens)
        tiered = until_whole_model(per_token, model, started, time.perf_counter, figured=True)
    later = [generate_once(target, inputs, args.new_tokens)[0] for _ in range(args.warmup)]
    steady_calls = args.steady_iters if args.steady_here else 0
    steady = [steady_decode(target, inputs, args.new_tokens)() for _ in range(steady_calls)]
    reference_model, _ = build(args)  # fresh and eager: same seed, same weights
    _, reference = generate_once(reference_model, inputs, args.new_tokens)
    return {
        "first_call_seconds": clock.times[1] - started,
        "first_generate_seconds": finished - started,
        "first_decode_gaps": clock.decode_gaps(),
        "later_calls_seconds": [statistics.median(c.decode_gaps()) for c in later],
        "steady_seconds": steady or None,
        "max_abs_diff": float(tokens_differing(tokens, reference)),
        "new_tokens": args.new_tokens,
        "tiered": tiered,
    }, target


def steady_decode(target: Any, inputs: Any, new_tokens: int) -> Callable[[], float]:
    """A call that runs one ``generate`` and returns its median seconds per decoded token."""

    def call() -> float:
        clock, _ = generate_once(target, inputs, new_tokens)
        return statistics.median(clock.decode_gaps())

    return call
