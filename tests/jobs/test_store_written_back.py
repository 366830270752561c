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

    options = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    model = torchkiln.compile(tiny_llama(), store=sys.argv[1], backend=sys.argv[3],
                              tiered={"enabled": False}, **options)
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


def _run(
    store: Path, tmp_path: Path, steps: list[str], backend: str, **options: object
) -> dict[str, object]:
    tiered = str(Path(__file__).resolve().parents[1] / "tiered")
    return run_json_script(
        tmp_path,
        "store_calls.py",
        SCRIPT,
        str(store),
        json.dumps(steps),
        backend,
        tiered,
        json.dumps(options),
    )


def _entries(store: Path) -> int:
    return sum(1 for p in (store / "entries").iterdir() if not p.name.startswith("."))


def _two_runs(tmp_path: Path, first: list[str], then: list[str]) -> tuple[dict, dict]:
    """``first`` in one process, ``then`` in the next, on one store (``aot_eager``): the first
    compiles the blocks' group for its first call and once for a miss, writing two entries;
    the second compiles nothing. Both match the eager model."""
    store = tmp_path / "store"
    before = _run(store, tmp_path, first, "aot_eager")
    assert before["exact"] and before["graphs"] == 2, before
    assert _entries(store) == 2
    after = _run(store, tmp_path, then, "aot_eager")
    assert after["exact"] and after["graphs"] == 0, after
    return before, after


def _block_line(run: dict) -> str:
    return next(line for line in run["code"] if "DecoderLayer" in line)


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_missed_call_is_written_to_the_store_and_served_by_the_next_run(tmp_path):
    # Batch 1 compiles the blocks' group; batch 3 misses (its first block) and is written back;
    # the second block and every later call fit one of the two.
    first, second = _two_runs(
        tmp_path, ["eval:1", "eval:3", "eval:1", "eval:3"], ["eval:3", "eval:1", "eval:3"]
    )
    assert "7 calls fit; 1 compiled and written to the store" in _block_line(first), first
    assert "ran the backend's code" not in _block_line(first)
    said = _block_line(second)
    assert "serving from store (2 functions" in said and "6 calls fit" in said, said


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_second_size_is_written_with_symbolic_sizes_and_covers_the_sizes_after_it(tmp_path):
    # Batches 5 and 7 fit the entry batch 3 wrote with symbolic sizes: nothing more compiles,
    # and the next run's batch 9 fits it too.
    first, _ = _two_runs(tmp_path, ["eval:1", "eval:3", "eval:5", "eval:7"], ["eval:9", "eval:1"])
    assert "7 calls fit; 1 compiled and written to the store" in _block_line(first), first


@pytest.mark.needs_feature("precompiled artifacts")
def test_evaluation_after_training_is_written_and_served_by_the_next_run(tmp_path):
    # Evaluation after a backward: the parameters hold gradients when its entry is saved (torch
    # could not load such an entry before they were set aside).
    store = tmp_path / "store"
    steps = ["train:2", "train:2", "eval:2"]
    first = _run(store, tmp_path, steps, "aot_eager")
    assert first["exact"], first
    assert any("(1 into new entries of the store)" in line for line in first["job"]), first
    second = _run(store, tmp_path, steps, "aot_eager")
    assert second["exact"] and second["graphs"] == 0, second
    assert not any("ran the backend's code" in line for line in second["code"]), second


OBJECT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch, torchkiln
    from torch import nn
    from torch._dynamo.utils import counters

    class Scale:  # what a cache object is to a call's key: a type, its int unseen
        def __init__(self, n):
            self.n = n

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.norm = nn.Linear(8, 8), nn.LayerNorm(8)
        def forward(self, x, scale):
            return self.norm(self.lin(x)) * scale.n

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(2))
        def forward(self, x, scale):
            for block in self.blocks:
                x = block(x, scale)
            return x

    torch.manual_seed(0)
    model = torchkiln.compile(Stack(), backend="aot_eager", store=sys.argv[1],
                              tiered={"enabled": False})
    reference = Stack()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 8)
    with torch.no_grad():
        exact = all(torch.allclose(model(x, Scale(n)), reference(x, Scale(n)))
                    for n in json.loads(sys.argv[2]))
    print(json.dumps({"graphs": counters["stats"]["unique_graphs"], "exact": exact,
                      "code": torchkiln.report(model).served_from}))
    """
)


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_call_its_keys_entry_does_not_fit_is_written_beside_it(tmp_path):
    # The key sees the call's shapes and the object's type, not its int: the call with n=2 has
    # the first call's key, and that entry's guard (n == 1) fails. Its entry goes beside the
    # first under a sibling key, with n symbolic (n=3 fits it); the next run loads both.
    store = tmp_path / "store"
    first = run_json_script(tmp_path, "objects.py", OBJECT_SCRIPT, str(store), "[1, 2, 3]")
    assert first["exact"] and first["graphs"] == 2, first
    assert "5 calls fit; 1 compiled and written to the store" in first["code"][0], first
    assert "L['args'][1].n == 1" in first["code"][0]  # the failing guard, named
    assert _entries(store) == 2
    second = run_json_script(tmp_path, "objects.py", OBJECT_SCRIPT, str(store), "[4, 5]")
    assert second["exact"] and second["graphs"] == 0, second
    assert "serving from store (2 functions: inference): 4 calls fit" in second["code"][0]


PEFT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch, torchkiln
    from torch._dynamo.utils import counters
    from peft import LoraConfig, get_peft_model
    sys.path.insert(0, sys.argv[2])
    from tiered_models import tiny_llama

    def lora():
        torch.manual_seed(0)
        return get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))

    reference = lora()
    model = torchkiln.compile(lora(), backend="aot_eager", store=sys.argv[1],
                              tiered={"enabled": False})
    exact = True
    for training, batch in [(True, 2), (True, 2), (False, 2), (False, 3)]:
        model.train(training), reference.train(training)
        ids = torch.randint(0, 256, (batch, 12), generator=torch.Generator().manual_seed(batch))
        with torch.set_grad_enabled(training):
            out, expected = model(input_ids=ids).logits, reference(input_ids=ids).logits
        exact &= torch.allclose(out, expected, atol=1e-4)
        if training:
            out.sum().backward()
            expected.sum().backward()
    print(json.dumps({"graphs": counters["stats"]["unique_graphs"], "exact": bool(exact),
                      "code": torchkiln.report(model).served_from}))
    """
)


@pytest.mark.needs_feature("precompiled artifacts")
def test_lora_training_then_evaluation_is_served_whole_by_the_next_run(tmp_path):
    # PEFT freezes the embeddings: in training the first block's input needs no gradient and
    # the second block's does, so the second block's first call misses and is written. Its
    # entry carries the group's fields (the first call's block), not its own (its layer_idx):
    # before, the next run did not load it and compiled that call again.
    pytest.importorskip("peft")
    store = tmp_path / "store"
    tiered = str(Path(__file__).resolve().parents[1] / "tiered")
    first = run_json_script(tmp_path, "lora.py", PEFT_SCRIPT, str(store), tiered)
    assert first["exact"] and first["graphs"] == 4, first
    assert "5 calls fit; 3 compiled and written to the store" in _block_line(first), first
    assert _entries(store) == 4
    second = run_json_script(tmp_path, "lora.py", PEFT_SCRIPT, str(store), tiered)
    assert second["exact"] and second["graphs"] == 0, second
    assert "(4 functions: training, inference): 8 calls fit" in _block_line(second), second


GENERATE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch, torchkiln
    from torch._dynamo.utils import counters
    sys.path.insert(0, sys.argv[2])
    from tiered_models import tiny_llama

    reference = tiny_llama().eval()
    model = torchkiln.compile(tiny_llama().eval(), store=sys.argv[1], tiered={"enabled": False})
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference.generate(ids, max_new_tokens=5, do_sample=False)
        tokens = model.generate(ids, max_new_tokens=5, do_sample=False)
    print(json.dumps({"graphs": counters["stats"]["unique_graphs"],
                      "equal": bool(torch.equal(tokens, expected)),
                      "code": torchkiln.report(model).served_from}))
    """
)


@pytest.mark.slow
@pytest.mark.needs_feature("precompiled artifacts")
def test_generate_with_inductor_is_written_and_served_whole_by_the_next_run(tmp_path):
    # The default backend, the serving call: a prefill then decode steps, whose KV cache grows
    # inside the layer views the blocks are given (the key sees none of it). Inductor's entry
    # for the first decode step guarded on more than its key, so the second step's entry goes
    # beside it; before, the second step was never kept and every run compiled it again.
    store = tmp_path / "store"
    tiered = str(Path(__file__).resolve().parents[1] / "tiered")
    first = run_json_script(tmp_path, "generate.py", GENERATE_SCRIPT, str(store), tiered)
    assert first["equal"] and first["graphs"] >= 2, first
    written = _entries(store) - 1
    calls = 2 * 5  # two blocks, a prefill and four decode steps
    assert f"{calls - written} calls fit; {written} compiled and written" in _block_line(first)
    second = run_json_script(tmp_path, "generate.py", GENERATE_SCRIPT, str(store), tiered)
    assert second["equal"] and second["graphs"] == 0, second
    assert f"({written + 1} functions: inference): {calls} calls fit" in _block_line(second)


@pytest.mark.needs_feature("precompiled artifacts")
def test_an_entry_another_process_wrote_since_serves_the_call_and_is_not_counted_as_compiled(
    tmp_path,
):
    # Two models on one store in one process, as two processes sharing it: both load the store
    # at their first call (batch 1); the first then writes batch 3's entry; the second's batch
    # 3 misses what it loaded, finds that entry under the call's key and runs it. The report
    # says so, not "compiled and written": Dynamo compiled nothing for that call.
    import torch

    import torchkiln
    from torchkiln._internals import dynamo
    from torchkiln.examples import llama

    def graphs() -> int:
        return int(dynamo.counters()["stats"]["unique_graphs"])

    def tiny_llama() -> torch.nn.Module:  # as tests/tiered/tiered_models.py's
        torch.manual_seed(0)
        sizes = {"hidden_size": 64, "intermediate_size": 128, "heads": 4, "kv_heads": 2}
        return llama(depth=2, vocab_size=256, **sizes).eval()

    store = str(tmp_path / "store")
    options = {"backend": "aot_eager", "store": store, "tiered": {"enabled": False}}
    models = [torchkiln.compile(tiny_llama(), progress="off", **options) for _ in "ab"]
    one, three = (torch.randint(0, 256, (batch, 12)) for batch in (1, 3))
    with torch.no_grad():
        for model in models:
            model(one)
        models[0](three)
        before = graphs()
        out = models[1](three).logits
        assert graphs() == before  # nothing traced: the entry the first model wrote ran
        assert torch.allclose(out, models[0](three).logits, atol=1e-5)
    first, second = (torchkiln.report(m) for m in models)
    assert "1 compiled and written to the store" in _block_line({"code": first.served_from})
    said = _block_line({"code": second.served_from})
    assert "3 calls fit; 1 fit entries another process wrote to the store since" in said, said
    assert "compiled and written" not in said and "backend's code" not in said, said
    [group] = second.job.groups
    assert (group.fitted_calls, group.other_calls, group.written) == (4, 0, 0)
    for model in models:
        torchkiln.decompile(model)
