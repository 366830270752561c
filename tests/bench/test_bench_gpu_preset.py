"""``torchkiln bench --preset gpu`` on the CPU: the plan (dry run), the time budget, the JSON
written after every cell, dtype and compile mode reaching the workers."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from torchkiln.bench import execute
from torchkiln.bench.plan import parameter_count, plan_from_args, planned_cells
from torchkiln.bench.results import CellResult, RunFailure
from torchkiln.bench.settings import BenchError, Cell, accelerate_available, make_settings
from torchkiln.cli.commands import build_parser, main


def _plan(*options: str) -> Any:
    return plan_from_args(build_parser().parse_args(["bench", *options]))


# --- the plan -----------------------------------------------------------------------------------


@pytest.mark.needs_feature("tiered compilation")  # the preset's tiered cells
def test_gpu_preset_dry_run_prints_the_plan_and_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--preset", "gpu", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # no JSON, no plot, no cache: nothing ran
    if not torch.cuda.is_available():  # without --dry-run, it needs the GPU it plans for
        assert main(["bench", "--preset", "gpu"]) == 2
        assert "--device cuda: torch sees no CUDA device here" in capsys.readouterr().err
        assert list(tmp_path.iterdir()) == []
    plan = _plan("--preset", "gpu", "--dry-run")
    assert (plan.preset, plan.budget_minutes) == ("gpu", 8.0)
    assert (plan.json_path, plan.plot_path) == ("bench-gpu.json", "bench-gpu.png")
    compiled = (
        ("full", "regional") + (("accelerate",) if accelerate_available() else ()) + ("tiered",)
    )
    runs = [(r.workload, r.mode, r.strategies) for r in plan.runs]
    assert runs == [
        ("forward", None, ("eager", *compiled)),
        ("generate", None, ("eager", *compiled)),
        ("forward", "reduce-overhead", compiled),  # eager does not depend on the mode
        ("generate", "reduce-overhead", compiled),
    ]
    for run in plan.runs:
        assert (run.model, run.dtype, run.device, run.depths, run.batches) == (
            "llama-1b", "bfloat16", "cuda", (32, 16), (1,)
        )  # fmt: skip
        assert (run.warm, run.steady_in_first_call, run.backend) == (False, True, "inductor")
    assert [run.steady_iters for run in plan.runs] == [20, 10, 20, 10]  # a generate: 15 gaps
    assert "1.24e9 (1,235,814,400)" in out and "depth 32: 2.21e9" in out
    assert "time budget: 8 min" in out and "bench-gpu.json (rewritten after every cell)" in out
    assert out.count("--dtype bfloat16") == len(planned_cells(plan))
    assert out.count("--mode reduce-overhead") == 2 * 2 * len(compiled)


def test_gpu_cells_run_most_valuable_first() -> None:
    cells = planned_cells(_plan("--preset", "gpu", "--dry-run"))
    order = [
        (p.cell.depth, p.step.settings.workload, p.step.settings.mode or "default") for p in cells
    ]
    # depth 32 forward default, generate default, then reduce-overhead; then depth 16 likewise
    blocks = list(dict.fromkeys(order))
    assert blocks == [
        (32, "forward", "default"),
        (32, "generate", "default"),
        (32, "forward", "reduce-overhead"),
        (32, "generate", "reduce-overhead"),
        (16, "forward", "default"),
        (16, "generate", "default"),
        (16, "forward", "reduce-overhead"),
        (16, "generate", "reduce-overhead"),
    ]
    assert order == sorted(order, key=blocks.index)  # each block's cells together
    assert [p.order for p in cells] == list(range(1, len(cells) + 1))
    assert [p.cell.strategy for p in cells[:3]] == ["eager", "full", "regional"]


def test_llama_1b_is_about_a_billion_parameters_at_depth_16() -> None:
    settings = _plan("--preset", "gpu", "--dry-run").runs[0]
    at_16 = parameter_count(settings, 16)
    assert 0.9e9 <= at_16 <= 1.3e9
    layer = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048  # q,o; k,v; mlp; norms
    embedding = 128256 * 2048  # tied: counted once
    assert at_16 == 16 * layer + embedding + 2048  # + the final norm
    assert parameter_count(settings, 32) - at_16 == 16 * layer


def test_llama_1b_builds_in_its_dtype_on_its_device() -> None:
    from torchkiln.examples import llama_1b

    model = llama_1b(depth=1, device="meta", dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model.config.use_cache is True  # the default config: the KV cache stays on
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as Llama-3.2-1B
    assert torch.get_default_dtype() == torch.float32  # restored after building


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--preset", "gpu", "--mode", "default"), "--preset gpu fixes --mode"),
        (("--preset", "gpu", "--workload", "forward"), "--preset gpu fixes --workload"),
        (("--preset", "gpu", "--device", "cpu"), "--mode reduce-overhead uses CUDA graphs"),
        (("--preset", "gpu", "--quick"), "--quick means --preset quick"),
        (("--preset", "gpu", "--budget-minutes", "0"), "--budget-minutes 0: must be > 0"),
        (("--dtype", "int8",), "--dtype 'int8': choose float32, bfloat16 or float16"),
        (("--mode", "fast",), "--mode 'fast': choose default, reduce-overhead, max-autotune"),
        (("--mode", "reduce-overhead"), "need --device cuda"),
        (
            ("--backend", "aot_eager", "--mode", "max-autotune-no-cudagraphs"),
            "backend 'aot_eager' does not take it; allowed: none",
        ),
    ],
)  # fmt: skip
def test_bad_gpu_options_are_named(options: tuple[str, ...], message: str) -> None:
    with pytest.raises(BenchError, match=re.escape(message)):
        _plan(*options, "--dry-run")


def test_dtype_and_mode_settings() -> None:
    assert make_settings(dtype="bf16").dtype == "bfloat16"
    assert make_settings(dtype="FP16").dtype == "float16"
    assert make_settings(mode="default").mode is None
    settings = make_settings(mode="max-autotune-no-cudagraphs")
    assert settings.mode == "max-autotune-no-cudagraphs"
    assert _plan("--quick", "--dry-run").budget_minutes is None


# --- the budget and the JSON after every cell ---------------------------------------------------


def test_budget_skips_the_rest_and_json_is_written_after_every_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    written: list[dict[str, Any]] = []
    real_write = execute.write_result

    def keep_a_copy(path: Path, document: dict[str, Any]) -> None:
        real_write(path, document)
        written.append(json.loads(path.read_text()))  # what a reader sees at that moment

    monkeypatch.setattr(execute, "write_result", keep_a_copy)
    out = tmp_path / "bench.json"
    # 0.005 min = 0.3 s: the first cell starts, its worker alone takes longer than that.
    code = main(["bench", "--model", "toy", "--depths", "1", "--batch", "1", "--seq", "8",
                 "--backend", "eager", "--strategies", "eager,full,regional", "--no-warm",
                 "--steady-iters", "2", "--device", "cpu", "--budget-minutes", "0.005",
                 "--json", str(out)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err  # what ran succeeded; skipped cells are no failure
    # one write per cell, one after the (skipped) steady-state run, the final one
    assert [len(d["cells"]) for d in written] == [1, 2, 3, 3, 3]
    assert [d["complete"] for d in written] == [False] * 4 + [True]
    first = written[0]["cells"][0]
    assert first["strategy"] == "eager" and first["cold_first_call_seconds"] > 0
    final = json.loads(out.read_text())
    assert final["budget_minutes"] == 0.005
    assert [c["skipped"] for c in final["cells"]] == [None, "time budget", "time budget"]
    assert final["cells"][0]["steady_failure"] == "skipped: time budget"
    assert all(c["failure"] is None for c in final["cells"])
    assert re.search(r"1\s+1\s+full\s+skipped: time budget\n", captured.out)
    assert "1 cells in" in captured.out and "2 skipped (time budget 0.005 min)" in captured.out


def test_a_cell_cut_short_by_the_budget_is_skipped_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("torchkiln.bench.runner.BUDGET_GRACE_SECONDS", 1.0)
    out = tmp_path / "bench.json"
    # 0.3 s of budget + 1 s of grace: the first worker (starting Python and torch) is stopped.
    code = main(["bench", "--model", "toy", "--depths", "1", "--batch", "1", "--seq", "8",
                 "--backend", "eager", "--strategies", "eager,full", "--no-warm",
                 "--budget-minutes", "0.005", "--json", str(out)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    cells = json.loads(out.read_text())["cells"]
    assert [c["skipped"] for c in cells] == ["time budget (stopped 1 s past it)", "time budget"]
    assert [c["failure"] for c in cells] == [None, None]
    assert "depth 1 batch 1 eager: skipped (time budget (stopped 1 s past it))" in captured.err


def test_a_plan_of_several_runs_is_one_json_document_and_one_plot(tmp_path: Path) -> None:
    plan = _plan("--preset", "gpu", "--dry-run")
    measured = CellResult(
        Cell(32, 1, "full"),
        cold={"first_call_seconds": 40.0, "after_later_calls": {}},
        steady_samples=[0.02, 0.021],
    )
    failed = CellResult(Cell(32, 1, "regional"), failure=RunFailure("cold", 1, "boom", ""))
    skipped = CellResult(Cell(16, 1, "full"), skipped="time budget")
    results: list[list[CellResult]] = [[measured, failed, skipped], [], [skipped], []]
    document = execute.bench_document(plan, {"torch": "x"}, results, 12.0, complete=False)
    assert document["preset"] == "gpu" and document["complete"] is False
    assert [r["settings"]["mode"] for r in document["runs"]] == [
        None, None, "reduce-overhead", "reduce-overhead"
    ]  # fmt: skip
    assert [c["skipped"] for c in document["runs"][0]["cells"]] == [None, None, "time budget"]
    from torchkiln.bench.plot import write_runs_plot

    panels = [(f"run {i}", r) for i, r in enumerate(results)]
    target = write_runs_plot(panels, tmp_path / "gpu.png", "test")  # survives missing cells
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- dtype and mode reach the worker ------------------------------------------------------------


class _Recorder:
    """Calls through to ``function`` and keeps the keyword arguments of every call."""

    def __init__(self, function: Any):
        self.function, self.calls = function, []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return self.function(*args, **kwargs)


def test_mode_reaches_every_compiled_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchkiln.bench.strategies import Strategies
    from torchkiln.examples import toy

    mode = "max-autotune-no-cudagraphs"
    strategies = Strategies("inductor", mode)
    compile_ = _Recorder(torch.compile)
    monkeypatch.setattr(torch, "compile", compile_)
    strategies.apply("full", toy(1))
    assert compile_.calls == [{"backend": "inductor", "mode": mode}]
    for strategy in ("regional", "hierarchical"):
        assert strategies.config(strategy).mode == mode
    model = toy(1)
    model_compile = _Recorder(model.compile)
    monkeypatch.setattr(model, "compile", model_compile)
    assert strategies.generation_target("full", model) is model
    assert model_compile.calls == [{"backend": "inductor", "mode": mode}]
    if accelerate_available():
        import accelerate.utils

        regions = _Recorder(accelerate.utils.compile_regions)
        monkeypatch.setattr(accelerate.utils, "compile_regions", regions)
        strategies.apply("accelerate", toy(1))
        assert regions.calls == [{"backend": "inductor", "mode": mode}]


# --- a plan of several runs, end to end on the CPU ----------------------------------------------


def test_a_plan_of_several_runs_end_to_end_and_replayed_from_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    import attrs

    from torchkiln.bench.plan import BenchPlan

    one = attrs.evolve(
        make_settings(model="toy", depths="1,2", batch="1", seq=8, strategies="eager,full",
                      backend="eager", steady_iters=3, warm=False),
        steady_in_first_call=True,
    )  # fmt: skip
    two = attrs.evolve(one, strategies=("full",), depths=(2,), dtype="bfloat16")
    out, png = tmp_path / "plan.json", tmp_path / "plan.png"
    plan = BenchPlan("gpu", (one, two), 30.0, str(out), str(png))
    assert execute.run_plan(plan, argparse.Namespace(cache_root=None, dry_run=False)) == 0
    captured = capsys.readouterr()
    document = json.loads(out.read_text())
    assert document["complete"] is True and len(document["runs"]) == 2
    first, second = ([(c["depth"], c["strategy"]) for c in r["cells"]] for r in document["runs"])
    assert first == [(2, "eager"), (2, "full"), (1, "eager"), (1, "full")]  # deeper first
    assert second == [(2, "full")]
    for run in document["runs"]:
        for cell in run["cells"]:
            # the steady state comes from the first-call process: 3 timed calls, no shared run
            assert len(cell["steady_seconds"]) == 3 and cell["steady_failure"] is None
            assert cell["cold"]["output_dtype"] == run["settings"]["dtype"]  # bf16 in run two
            assert cell["cold"]["dtype"] == run["settings"]["dtype"]
            assert cell["cold"]["max_abs_diff"] == 0.0
    assert "3 calls timed in the first-call process" in captured.out
    assert "model toy, bfloat16, seq 8" in captured.out
    # the order the cells ran in: depth 2 of both runs, then depth 1
    ran = re.findall(
        r"depth (\d) batch 1 (\w+) \(forward, mode default\): first call", captured.err
    )
    assert ran == [("2", "eager"), ("2", "full"), ("2", "full"), ("1", "eager"), ("1", "full")]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    replot = tmp_path / "again.png"
    assert main(["bench", "--from-json", str(out), "--plot", str(replot)]) == 0
    replayed = capsys.readouterr().out
    assert replayed.count("=== forward, mode default ===") == 2
    assert replot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_from_json_refuses_what_a_bench_did_not_write(tmp_path: Path) -> None:
    from torchkiln.bench.execute import load_runs

    (tmp_path / "other.json").write_text('{"cells": []}')
    with pytest.raises(BenchError, match="not written by torchkiln bench --json"):
        load_runs(tmp_path / "other.json")
    with pytest.raises(BenchError, match="cannot read a bench JSON document"):
        load_runs(tmp_path / "missing.json")


def test_the_gpu_script_is_valid_bash_and_its_bench_command_parses() -> None:
    import shutil
    import subprocess

    script = Path(__file__).parents[2] / "examples" / "gpu_bench.sh"
    bash = shutil.which("bash")
    if bash is not None:
        subprocess.run([bash, "-n", str(script)], check=True)
    text = script.read_text()
    assert "python3 -m torchkiln bench --preset gpu" in text and "PYTHONUNBUFFERED=1" in text
    assert "pip install" not in text  # it installs nothing
    plan = _plan("--preset", "gpu", "--budget-minutes", "8", "--json", "o/bench-gpu.json",
                 "--plot", "o/bench-gpu.png", "--dry-run")  # fmt: skip
    assert (plan.json_path, plan.plot_path, plan.budget_minutes) == (
        "o/bench-gpu.json", "o/bench-gpu.png", 8.0
    )  # fmt: skip


def test_the_preset_leaves_out_what_this_torch_lacks_and_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The GPU machine runs torch 2.11, which has no aot_compile: tiered is left out, said."""
    from torchkiln._internals import versions
    from torchkiln.bench.plan import _gpu_strategies

    feature = versions.FEATURES["tiered compilation"]
    missing = versions.Feature(feature.name, feature.needs, "9.9", lambda: False)
    monkeypatch.setitem(versions.FEATURES, "tiered compilation", missing)
    chosen = _gpu_strategies(argparse.Namespace(strategies=None)).split(",")
    assert "tiered" not in chosen and chosen[:3] == ["eager", "full", "regional"]
    assert "--preset gpu leaves out tiered: tiered compilation needs" in capsys.readouterr().err
