"""``store=``: every entry of a group is loaded and the saved guards decide which call it fits;
the key (the first call's exact shapes) only names the entry's directory.

Three processes name one store, as a restarted job would: the first calls batch 1, the second
batch 3 then batch 1, the third alternates both. Dynamo's counter of compiled graphs in each
process is the witness (nothing of torchkiln's is counted).
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
    sys.path.insert(0, sys.argv[3])
    from tiered_models import tiny_llama

    model = torchkiln.compile(tiny_llama(), store=sys.argv[1], backend="aot_eager",
                              tiered={"enabled": False})
    reference = tiny_llama()
    exact = True
    with torch.no_grad():
        for batch in json.loads(sys.argv[2]):
            ids = torch.randint(0, 256, (batch, 12), generator=torch.Generator().manual_seed(batch))
            exact &= torch.allclose(model(ids).logits, reference(ids).logits, atol=1e-5)
    code = torchkiln.report(model).served_from[0]
    print(json.dumps({"graphs": counters["stats"]["unique_graphs"], "exact": bool(exact),
                      "code": code}))
    """
)


def _run(store: Path, tmp_path: Path, batches: list[int]) -> dict[str, object]:
    tiered = str(Path(__file__).resolve().parents[1] / "tiered")
    return run_json_script(
        tmp_path, "store_calls.py", SCRIPT, str(store), json.dumps(batches), tiered
    )


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_stored_entry_serves_every_call_its_guards_pass_whatever_came_first(tmp_path):
    store = tmp_path / "store"
    first = _run(store, tmp_path, [1])
    assert first["exact"] and first["graphs"] == 1
    # Batch 3 first: its entry is compiled and stored; batch 1 runs the stored entry.
    second = _run(store, tmp_path, [3, 1])
    assert second["exact"] and second["graphs"] == 1, second
    assert "2 functions" in second["code"] and "4 calls fit" in second["code"], second
    # Both entries stored: nothing is compiled, every call fits.
    third = _run(store, tmp_path, [3, 1, 3, 1])
    assert third["exact"] and third["graphs"] == 0, third
    assert "serving from store (2 functions" in third["code"] and "8 calls fit" in third["code"]
    assert "ran the backend's code" not in third["code"]
