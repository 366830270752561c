"""The report says what ran, per region, and agrees with the profiler (tests/profiler_witness.py):
never re-derived under the report's own global state, never read from a log."""

from __future__ import annotations

import dis
import logging
from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
from profiler_witness import assert_report_agrees, profiled_block_calls
from test_live_report import WIDTH, Stack

import torchkiln


@pytest.fixture
def recompile_limit() -> Iterator[None]:
    with torch._dynamo.config.patch(recompile_limit=1):
        yield


def run_with_later_limit_hit(model: Stack) -> None:
    """Calls under no_grad; block 2 changes and hits the limit on a later call."""
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(2, WIDTH))
        model.blocks[2].gate = False
        for _ in range(5):
            model(torch.randn(2, WIDTH))


def test_a_limit_hit_under_no_grad_reported_outside_it_agrees_with_the_profiler(
    recompile_limit: None,
) -> None:
    model = torchkiln.compile(Stack(), backend="eager", progress="off")
    seen = profiled_block_calls(model.blocks, lambda: run_with_later_limit_hit(model))
    assert [s.eager for s in seen] == [0, 0, 5, 0]  # the witness saw the hit
    assert torch.is_grad_enabled()
    report = torchkiln.report(model)
    assert_report_agrees(report, model.blocks, seen)
    assert [r.recompile_limit_hit for r in report.regions] == [False, False, True, False]
    assert "GLOBAL_STATE" not in str(report)


def test_silenced_logs_change_nothing_in_the_report(recompile_limit: None) -> None:
    model = torchkiln.compile(Stack(), backend="eager", progress="off")
    dynamo_log = logging.getLogger("torch._dynamo")
    level = dynamo_log.level
    dynamo_log.setLevel(logging.CRITICAL)
    try:
        run_with_later_limit_hit(model)
    finally:
        dynamo_log.setLevel(level)
    report = torchkiln.report(model)
    assert [(r.status, r.eager_calls) for r in report.regions] == [
        ("compiled", 0),
        ("compiled", 0),
        ("eager", 5),
        ("compiled", 0),
    ]
    assert report.regions[2].recompile_limit_hit
    assert "no cached graph fits (1 cached): L['module'].gate == True" in str(report)


def test_compiled_code_holds_no_witness() -> None:
    """The eager-run count sits in a branch Dynamo folds away: a call that runs compiled code
    runs none of torchkiln's code for it (principle 6)."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    model = torchkiln.compile(Stack(), backend="eager", progress="off")
    with torch.no_grad():
        model(torch.randn(2, WIDTH))
    [code] = model.__dict__["_torchkiln_compiled"].codes.values()
    entries = _debug_get_cache_entry_list(code)
    assert entries
    for entry in entries:
        loaded = {i.argval for i in dis.get_instructions(entry.code) if "LOAD" in i.opname}
        assert "ran_eagerly" not in loaded
        assert "is_compiling" not in loaded
    assert [r.eager_calls for r in torchkiln.report(model).regions] == [0] * 4


def test_a_forced_eager_stance_is_counted_and_named() -> None:
    model = torchkiln.compile(Stack(), backend="eager", progress="off")
    with torch.no_grad():
        model(torch.randn(2, WIDTH))
        with torch.compiler.set_stance("force_eager"):
            model(torch.randn(2, WIDTH))
    report = torchkiln.report(model)
    assert [r.eager_calls for r in report.regions] == [1] * 4
    assert all("force_eager" in (r.fallback_reason or "") for r in report.regions)
