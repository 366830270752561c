"""``tiered.when``: the first call starts a builder only where it pays (docs/tiered.md, "When
tiered pays"); otherwise the model stays regional and the report says why, with the numbers."""

from __future__ import annotations

import os

import pytest
import torch
from tiered_models import tiny_llama

import torchkiln
import torchkiln.tiered
from torchkiln.configuration.config import CompileConfig, TieredConfig
from torchkiln.tiered.decision import Machine, builder_problem, core_left_free

pytestmark = pytest.mark.needs_feature("tiered compilation")


def config(when: str, threads: int = 1) -> CompileConfig:
    return CompileConfig(tiered=TieredConfig(enabled=True, when=when, threads=threads))


@pytest.mark.parametrize(
    ("machine", "threads", "starts"),
    [
        (Machine("cuda", 2, 2, 1), 1, True),  # an accelerator: the steps leave the CPU
        (Machine("cpu", 2, 2, 1), 1, False),  # every core busy
        (Machine("cpu", 2, 1, 1), 1, True),  # one core left free
        (Machine("cpu", 2, 1, 2), 1, False),  # ... but taken by the job's other rank
        (Machine("cpu", 8, 4, 1), 4, True),
        (Machine("cpu", 8, 4, 1), 5, False),  # the builder asks for more than is free
    ],
)
def test_auto_starts_the_builder_only_with_cores_to_spare(
    machine: Machine, threads: int, starts: bool
) -> None:
    assert (builder_problem(config("auto", threads), machine) is None) is starts
    # always starts it anyway, at the lowest priority where no core is free (the governor)
    assert core_left_free(config("always", threads), machine) is starts
    assert builder_problem(config("always", threads), machine) is None
    assert builder_problem(config("never", threads), machine) == "tiered.when is never"


def test_the_reason_gives_the_numbers() -> None:
    reason = builder_problem(config("auto"), Machine("cpu", 2, 2, 2))
    assert reason is not None and reason.startswith(
        "tiered.when is auto and the model runs on the CPU: its steps use 4 of the 2 cores this "
        "process may use (torch.get_num_threads() = 2 x 2 ranks on this machine), and a "
        "builder needs 1 more (tiered.threads)"
    )


@pytest.mark.parametrize("when", ["auto", "never"])
def test_a_declined_builder_leaves_the_model_regional_and_says_why(when: str) -> None:
    cores = len(os.sched_getaffinity(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(cores)  # every core busy: auto declines
    try:
        model = torchkiln.compile(
            tiny_llama(2), backend="aot_eager", tiered={"enabled": True, "when": when}
        )
        ids = torch.randint(0, 128, (1, 8))
        with torch.no_grad():
            expected = type(model).forward(model, ids).logits
            for _ in range(3):
                assert torch.allclose(model(ids).logits, expected, atol=1e-5)
        tiers = torchkiln.tiered.tiers(model)
    finally:
        torch.set_num_threads(threads)
    assert (tiers.state, tiers.serving, tiers.builder_processes) == ("failed", "regional", 0)
    assert tiers.calls == {"regional": 3, "whole-model": 0}
    expected_reason = (
        "tiered.when is never"
        if when == "never"
        else f"tiered.when is auto and the model runs on the CPU: its steps use {cores} of the "
        f"{cores} cores"
    )
    assert tiers.reason.startswith(expected_reason)
    assert f"  reason: {tiers.reason}" in tiers.lines()
    torchkiln.decompile(model)
