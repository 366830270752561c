"""The report's compile and load seconds with a store: what this run compiled, and what it
loaded instead, agree with the ``job:`` lines and with what the test itself saw (issue 41)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

import torchkiln
from torchkiln._internals import dynamo
from torchkiln.examples import llama

SHAPE = {"depth": 2, "hidden_size": 32, "heads": 4, "kv_heads": 2, "intermediate_size": 64,
         "vocab_size": 128}  # fmt: skip


def _graphs() -> int:
    return int(dynamo.counters()["stats"]["unique_graphs"])


def _first_call(model: torch.nn.Module, store: Path) -> float:
    """Compile against ``store``, run the first call; its wall-clock seconds (the witness)."""
    torchkiln.compile(model, backend="aot_eager", job={"store": str(store)}, progress="off")
    started = time.perf_counter()
    with torch.no_grad():
        model(torch.randint(0, 128, (1, 8)))
    return time.perf_counter() - started


@pytest.mark.needs_feature("precompiled artifacts")
def test_compile_and_load_seconds_agree_with_the_job_and_the_clock(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = llama(**SHAPE).eval()
    wall = _first_call(model, tmp_path / "store")
    report = torchkiln.report(model)
    [share] = report.job.groups
    first = report.regions[0]
    # Before: 0.00 in the table while the job line said "compile 2.4 s".
    assert share.role == "compiled" and share.compile_seconds > 0
    assert first.compile_seconds >= share.compile_seconds - 1e-6  # the report rounds to 1 us
    assert first.compile_seconds + first.load_seconds <= wall
    assert (first.loaded_from, first.load_seconds) == (None, share.load_seconds)
    assert report.total_compile_seconds == pytest.approx(first.compile_seconds)
    assert f"compiled in {first.compile_seconds:.2f} s" in str(report)
    torchkiln.decompile(model)

    graphs_before = _graphs()
    wall = _first_call(model, tmp_path / "store")
    report = torchkiln.report(model)
    [share] = report.job.groups
    first = report.regions[0]
    assert share.role == "store" and _graphs() == graphs_before  # nothing compiled: witnessed
    assert (first.status, first.loaded_from, first.load_seconds) == (
        "serving",
        "store",
        share.load_seconds,
    )
    assert first.compile_seconds == 0.0 and not first.reused and 0 < first.load_seconds <= wall
    text = str(report)
    row = next(line for line in text.splitlines() if line.startswith("model.layers.0 "))
    assert row.split()[2:6] == ["serving", "0", "-", f"{first.load_seconds:.2f}"]
    assert (
        f"0 graphs compiled in 0.00 s; 1 group loaded from store in {first.load_seconds:.2f} s"
        in text
    )


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_group_loaded_from_artifacts_is_reported_loaded_with_its_load_time(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = llama(**SHAPE).eval()
    ids = torch.randint(0, 128, (1, 8))
    torchkiln.precompile(model, ids, tmp_path, backend="aot_eager", kinds=["inference"])
    graphs_before = _graphs()
    started = time.perf_counter()
    torchkiln.compile(model, backend="aot_eager", artifacts=str(tmp_path), progress="off")
    with torch.no_grad():
        model(ids)
    wall = time.perf_counter() - started
    first = torchkiln.report(model).regions[0]
    assert _graphs() == graphs_before  # the witness: nothing was compiled
    assert first.loaded_from == f"artifacts {tmp_path}" and first.compile_seconds == 0.0
    assert first.load_seconds is not None and 0 < first.load_seconds <= wall
