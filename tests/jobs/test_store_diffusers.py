"""``store=`` on a diffusers model: SD3's transformer from its default config (sizes changed only).

Its attention blocks read their processor's signature, which Dynamo guards by identity; torch
cannot save such a guard, so these blocks could not be stored at all. Saved functions now drop
it (the key covers the processor's class, :mod:`torchkiln.engine.saved_guards`) and keep the
guard on the processor's type. Each run is a fresh process on one store; Dynamo's counter of
compiled graphs is the witness, and every call is compared with the same model run eagerly.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from json_scripts import run_json_script

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch, torchkiln, diffusers
    from diffusers.models.attention_processor import JointAttnProcessor2_0
    from torch._dynamo.utils import counters


    class Processor(JointAttnProcessor2_0):
        '''diffusers' own processor, under a class of this file.'''


    class Doubled(JointAttnProcessor2_0):
        '''Another processor class of this file, whose output differs.'''

        def __call__(self, *args, **kwargs):
            out = super().__call__(*args, **kwargs)
            return tuple(o * 2 for o in out) if isinstance(out, tuple) else out * 2


    def sd3():
        torch.manual_seed(0)
        model = diffusers.SD3Transformer2DModel(
            sample_size=16, patch_size=2, in_channels=4, num_layers=4, attention_head_dim=8,
            num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16,
            pooled_projection_dim=16, out_channels=4, pos_embed_max_size=32,
        ).eval()
        model.set_attn_processor({"default": Processor, "doubled": Doubled}[sys.argv[3]]())
        return model


    def inputs(batch):
        g = torch.Generator().manual_seed(batch)
        return dict(
            hidden_states=torch.randn(batch, 4, 16, 16, generator=g),
            encoder_hidden_states=torch.randn(batch, 5, 32, generator=g),
            pooled_projections=torch.randn(batch, 16, generator=g),
            timestep=torch.tensor([3] * batch),
        )


    reference = sd3()
    model = torchkiln.compile(sd3(), store=sys.argv[1], backend=sys.argv[2],
                              tiered={"enabled": False})
    exact = True
    with torch.no_grad():
        for batch in (1, 2, 1):
            out, expected = model(**inputs(batch)).sample, reference(**inputs(batch)).sample
            exact &= torch.allclose(out, expected, atol=1e-4)
    report = torchkiln.report(model)
    print(json.dumps({"graphs": counters["stats"]["unique_graphs"], "exact": bool(exact),
                      "code": report.served_from, "job": report.job.lines()}))
    """
)


def _run(tmp_path: Path, backend: str, processor: str) -> dict:
    pytest.importorskip("diffusers")
    store = tmp_path / "store"
    run = run_json_script(tmp_path, "sd3_store.py", SCRIPT, str(store), backend, processor)
    assert run["exact"], run
    return run


def _joint_line(run: dict) -> str:
    return next(line for line in run["code"] if "JointTransformerBlock" in line)


@pytest.mark.slow
@pytest.mark.needs_feature("precompiled artifacts")
def test_sd3_blocks_are_stored_and_the_next_run_compiles_nothing_with_inductor(tmp_path):
    first = _run(tmp_path, "inductor", "default")
    assert first["graphs"] > 0
    assert not any("cannot be serialized" in line for line in first["job"]), first["job"]
    second = _run(tmp_path, "inductor", "default")
    assert second["graphs"] == 0, second
    said = _joint_line(second)
    assert said.startswith("JointTransformerBlock: serving from store") and "calls fit" in said
    assert "ran the backend's code" not in said, said


@pytest.mark.needs_feature("precompiled artifacts")
def test_another_processor_class_does_not_fit_the_stored_blocks(tmp_path):
    _run(tmp_path, "aot_eager", "default")
    # Both processor classes live in one file (one code hash): the saved guard on the
    # processor's type is what refuses the stored function; the miss is written back.
    doubled = _run(tmp_path, "aot_eager", "doubled")
    said = _joint_line(doubled)
    assert doubled["graphs"] > 0 and "compiled and written to the store" in said, said
    assert "processor" in said, said  # the failing guard, named
    again = _run(tmp_path, "aot_eager", "default")
    assert again["graphs"] == 0, again
    said = _joint_line(again)
    # Every entry the two processors' runs wrote is loaded; the guards pick the default's.
    assert "serving from store (" in said and ": 9 calls fit" in said, said
    assert "missed" not in said and "backend" not in said, said
