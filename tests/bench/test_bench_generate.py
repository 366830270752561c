"""``torchkiln bench --workload generate``: settings, and one end-to-end run in workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchkiln.bench.settings import BenchError, make_settings
from torchkiln.bench.targets import check_targets
from torchkiln.cli.commands import main


@pytest.mark.needs_feature("precompiled artifacts")  # in the default strategies
def test_workload_settings() -> None:
    assert make_settings().workload == "forward"
    assert make_settings(train=True).workload == "train"
    generate = make_settings(workload="generate", new_tokens=8)
    assert (generate.workload, generate.new_tokens, generate.train) == ("generate", 8, False)
    assert make_settings(workload="train").train is True
    # The default strategies leave precompiled out of generate (one prefill call's artifacts).
    assert "precompiled" in make_settings().strategies
    assert "precompiled" not in generate.strategies


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"workload": "decode"}, "--workload 'decode': choose forward, train, generate"),
        ({"workload": "generate", "train": True}, "--train means --workload train"),
        ({"workload": "generate", "new_tokens": 1}, "--new-tokens 1: must be >= 2"),
        (
            {"workload": "generate", "strategies": "full,precompiled"},
            "precompiled, which --workload generate cannot run",
        ),
    ],
)
def test_bad_workload_options_are_named(options: dict[str, object], message: str) -> None:
    with pytest.raises(BenchError, match=message.replace("(", r"\(").replace("'", "'")):
        make_settings(**options)  # type: ignore[arg-type]


def test_generate_targets_are_the_issues() -> None:
    names = [target.name for target in check_targets([], "generate")]
    assert names == [
        "regional time to first token vs full (depth 32)",
        "regional time to first token vs accelerate compile_regions (depth 32)",
        "regional time per decoded token vs full (depth 32)",
        # issue 21, judged on the generate workload too (per decoded token after the switch)
        "tiered first call vs regional cold",
        "tiered time to whole-model speed vs full cold first call",
        "tiered steady after the switch vs full (depth 16, 32)",
    ]
    limits = [target.limit for target in check_targets([], "generate")]
    assert limits == [0.4, 0.85, 1.1, 1.1, 1.2, 1.02]


@pytest.mark.slow  # 4 worker processes, each importing transformers
def test_generate_workload_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    code = main(["bench", "--model", "llama", "--depths", "2", "--batch", "1", "--seq", "8",
                 "--workload", "generate", "--new-tokens", "4", "--backend", "eager",
                 "--strategies", "eager,full,regional", "--no-warm", "--steady-iters", "3",
                 "--json", str(out)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    document = json.loads(out.read_text())
    assert document["settings"]["workload"] == "generate"
    for cell in document["cells"]:
        cold = cell["cold"]
        assert cold["workload"] == "generate" and cold["new_tokens"] == 4
        assert 0 < cold["first_call_seconds"] < cold["first_generate_seconds"]
        assert len(cold["first_decode_gaps"]) == 3  # 4 tokens: the first, then 3 decode steps
        assert cold["max_abs_diff"] == 0.0  # generated ids identical to eager
        assert len(cell["steady_seconds"]) == 3 and cell["steady_median_seconds"] > 0
    regional = document["cells"][2]["cold"]
    assert regional["torchkiln_report"]["statuses"] == ["compiled"]
    assert "time to the first generated token" in captured.out
    assert "regional time per decoded token vs full (depth 32)" in captured.out
