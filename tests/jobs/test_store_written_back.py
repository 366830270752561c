"""``store=``: a call no stored entry fits is compiled into a new entry of the store, so that the
next run serves it too (training then evaluation, the last short batch).

Processes name one store, as restarts would, on a default-config Llama (tiny sizes). Dynamo's
counter of compiled graphs in each process is the witness, and the outputs are compared with the
same model run eagerly. A call whose shapes differ from the first call's is written with
symbolic sizes (as torch's automatic dynamic shapes would recompile it), so later sizes fit it.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from json_scripts import run_json_script

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch, torchkiln
    from torch._dynamo.utils import counters
    sys.path.insert(0, sys.argv[4])
    from tiered_models import tiny_llama

    model = torchkiln.compile(tiny_llama(), store=sys.argv[1], backend=sys.argv[3],
                              tiered={"enabled": False})
    reference = tiny_llama()
    exact = True
    for step in json.loads(sys.argv[2]):
        training, batch = step.startswith("train"), int(step.split(":")[1])
        model.train(training), reference.train(training)
        ids = torch.randint(0, 256, (batch, 12), generator=torch.Generator().manual_seed(batch))
        with torch.set_grad_enabled(training):
            out, expected = model(ids).logits, reference(ids).logits
        exact &= torch.allclose(out, expected, atol=1e-4)
        if training:
            out.sum().backward()
    report = torchkiln.report(model)
    print(json.dumps({"graphs": counters["stats"]["unique_graphs"], "exact": bool(exact),
                      "code": report.served_from, "job": report.job.lines()}))
    """
)


def _run(store: Path, tmp_path: Path, steps: list[str], backend: str) -> dict[str, object]:
    tiered = str(Path(__file__).resolve().parents[1] / "tiered")
    return run_json_script(
        tmp_path, "store_calls.py", SCRIPT, str(store), json.dumps(steps), backend, tiered
    )


def _entries(store: Path) -> int:
    return sum(1 for p in (store / "entries").iterdir() if not p.name.startswith("."))


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_missed_call_is_written_to_the_store_and_served_by_the_next_run(tmp_path):
    store = tmp_path / "store"
    first = _run(store, tmp_path, ["eval:1", "eval:3", "eval:1", "eval:3"], "aot_eager")
    # Batch 1 compiles the blocks' group; batch 3 misses (its first block) and is written back;
    # the second block and every later call fit one of the two.
    assert first["exact"] and first["graphs"] == 2, first
    assert _entries(store) == 2
    block = next(line for line in first["code"] if "DecoderLayer" in line)
    assert "7 calls fit; 1 compiled and written to the store" in block, block
    assert "ran the backend's code" not in block
    second = _run(store, tmp_path, ["eval:3", "eval:1", "eval:3"], "aot_eager")
    assert second["exact"] and second["graphs"] == 0, second
    block = next(line for line in second["code"] if "DecoderLayer" in line)
    assert "serving from store (2 functions" in block and "6 calls fit" in block, block


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_second_size_is_written_with_symbolic_sizes_and_covers_the_sizes_after_it(tmp_path):
    store = tmp_path / "store"
    first = _run(store, tmp_path, ["eval:1", "eval:3", "eval:5", "eval:7"], "aot_eager")
    # Batches 5 and 7 fit the entry batch 3 wrote with symbolic sizes: nothing more compiles.
    assert first["exact"] and first["graphs"] == 2, first
    assert _entries(store) == 2
    second = _run(store, tmp_path, ["eval:9", "eval:1"], "aot_eager")
    assert second["exact"] and second["graphs"] == 0, second


@pytest.mark.slow
@pytest.mark.needs_feature("precompiled artifacts")
def test_training_then_evaluation_with_inductor_is_served_whole_by_the_next_run(tmp_path):
    # Evaluation after a backward: the parameters hold gradients when its entry is saved.
    store = tmp_path / "store"
    steps = ["train:2", "train:2", "eval:2"]
    first = _run(store, tmp_path, steps, "inductor")
    assert first["exact"], first
    assert any("into new entries of the store" in line for line in first["job"]), first["job"]
    second = _run(store, tmp_path, steps, "inductor")
    assert second["exact"] and second["graphs"] == 0, second
    assert not any("ran the backend's code" in line for line in second["code"]), second
