"""Side by side with the installed Accelerate: the same answers where Accelerate is correct,
and its defects reproduced on the cases torchkiln handles (see test_accelerate_defects.py)."""

from __future__ import annotations

import types

import pytest
import torch
from accelerate_helpers import compiled_graphs, gpt2_model, llama_model, logits, token_ids
from torch import nn

import torchkiln
from torchkiln.compat import accelerate as kiln

accelerate_utils = pytest.importorskip("accelerate.utils")
accelerate_other = pytest.importorskip("accelerate.utils.other")

OptimizedModule = torch._dynamo.eval_frame.OptimizedModule


def accelerate_compiled_paths(compiled: nn.Module) -> set[str]:
    """Paths Accelerate compiled, in the original model's terms (no ``_orig_mod`` levels)."""
    return {
        path.replace("._orig_mod", "").replace("_orig_mod.", "")
        for path, module in compiled.named_modules()
        if isinstance(module, OptimizedModule)
    }


def has_parameters(model: nn.Module, path: str) -> bool:
    return next(model.get_submodule(path).parameters(), None) is not None


def test_dynamo_backend_members_are_accelerates() -> None:
    theirs = accelerate_utils.DynamoBackend
    assert [(m.name, m.value) for m in kiln.DynamoBackend] == [(m.name, m.value) for m in theirs]


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"ACCELERATE_DYNAMO_BACKEND": "INDUCTOR"},
        {
            "ACCELERATE_DYNAMO_BACKEND": "aot_eager",
            "ACCELERATE_DYNAMO_MODE": "max-autotune",
            "ACCELERATE_DYNAMO_USE_FULLGRAPH": "yes",
            "ACCELERATE_DYNAMO_USE_DYNAMIC": "1",
            "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "true",
        },
        {
            "ACCELERATE_DYNAMO_BACKEND": "EAGER",
            "ACCELERATE_DYNAMO_MODE": "default",
            "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False",
            "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "False",
        },
    ],
    ids=["unset", "backend-only", "everything", "launcher-defaults"],
)
def test_torch_dynamo_plugin_matches_accelerates(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ours, theirs = kiln.TorchDynamoPlugin(), accelerate_utils.TorchDynamoPlugin()
    assert ours.to_dict() == theirs.to_dict()
    assert ours.to_kwargs() == theirs.to_kwargs()
    explicit = {
        "backend": "eager",
        "mode": "reduce-overhead",
        "dynamic": False,
        "options": {"a": 1},
    }
    assert kiln.TorchDynamoPlugin(**explicit).to_kwargs() == (
        accelerate_utils.TorchDynamoPlugin(**explicit).to_kwargs()
    )


def test_launcher_false_dynamic_is_not_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one deliberate difference: ``accelerate launch`` always exports
    ``ACCELERATE_DYNAMO_USE_DYNAMIC=False``; Accelerate then forces static shapes."""
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "False")
    assert accelerate_utils.TorchDynamoPlugin().to_kwargs() == {
        "backend": "inductor",
        "dynamic": False,
    }
    assert kiln.TorchDynamoPlugin().to_kwargs() == {"backend": "inductor"}


@pytest.mark.parametrize("build", [gpt2_model, llama_model], ids=["gpt2", "llama"])
def test_same_regions_and_outputs_as_accelerate(build) -> None:
    ids = token_ids()
    reference_model = build()
    eager = logits(reference_model, ids)
    theirs = accelerate_other.compile_regions(reference_model, backend="eager")
    their_out = logits(theirs, ids)

    ours = kiln.compile_regions(build(), backend="eager")
    our_out = logits(ours, ids)

    our_paths = {r["path"] for r in torchkiln.report(ours).to_dict()["regions"]}
    their_paths = accelerate_compiled_paths(theirs)
    # Accelerate also wraps parameterless modules (dropout, rotary embedding) on their own;
    # torchkiln leaves those eager: nothing to gain from compiling them alone.
    assert our_paths == {p for p in their_paths if has_parameters(reference_model, p)}
    assert their_paths - our_paths <= {"transformer.drop", "model.rotary_emb"}
    torch.testing.assert_close(our_out, their_out)
    torch.testing.assert_close(our_out, eager)


def test_accelerate_runs_nothing_compiled_under_an_autocast_wrapped_forward() -> None:
    model = gpt2_model()
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)
    theirs = accelerate_other.compile_regions(model, backend="eager")
    logits(theirs, token_ids())
    assert compiled_graphs() == 0  # the copy calls the original model's (uncompiled) blocks
    # torchkiln on the same case: test_regions_compile_under_a_mixed_precision_forward (5 graphs)


def test_accelerate_puts_orig_mod_in_checkpoint_keys() -> None:
    model = gpt2_model()
    plain_keys = list(model.state_dict())
    theirs = accelerate_other.compile_regions(model, backend="eager")
    assert "transformer.h.0._orig_mod.ln_1.weight" in theirs.state_dict()
    ours = kiln.compile_regions(gpt2_model(), backend="eager")
    assert list(ours.state_dict()) == plain_keys


def test_accelerates_unwrap_mutates_the_prepared_model() -> None:
    model = gpt2_model()
    model._original_forward = model.forward
    model.forward = types.MethodType(
        torch.autocast("cpu", dtype=torch.bfloat16)(model.forward.__func__), model
    )
    accelerate_other.extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert "_original_forward" not in model.__dict__
    assert logits(model, token_ids()).dtype == torch.float32  # training lost mixed precision
    # torchkiln: test_unwrap_without_fp32_wrapper_leaves_the_prepared_model_alone


def test_accelerates_fsdp2_variant_compiles_nothing_on_nn_builtins_up_to_torch_2_13() -> None:
    from torchkiln._internals import versions
    from torchkiln.examples import toy

    model = toy(depth=2)
    accelerate_other.compile_regions_fsdp2(model, backend="eager")
    model(torch.randint(0, 512, (2, 8)))
    if versions.module_compile_skips_torch_nn():
        assert compiled_graphs() == 0
    else:  # torch 2.14 compiles torch.nn built-ins through Module.compile()
        assert compiled_graphs() >= 1
    # torchkiln: test_nn_builtin_blocks_really_compile_in_the_fsdp2_variant (4 graphs)


def test_accelerate_falls_back_to_a_whole_compile_for_sequential_blocks() -> None:
    def stack() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Embedding(64, 16),
            nn.Sequential(
                *(nn.TransformerEncoderLayer(16, 2, 32, 0.0, batch_first=True) for _ in range(2))
            ),
            nn.Linear(16, 64),
        )

    ids = torch.randint(0, 64, (2, 5))
    theirs = accelerate_other.compile_regions(stack(), backend="eager")
    assert isinstance(theirs, OptimizedModule)  # no block found: one whole-model compile
    ours = kiln.compile_regions(stack(), backend="eager")
    assert [r["path"] for r in torchkiln.report(ours).to_dict()["regions"]] == [
        "1.0",
        "1.1",
        "0",
        "2",
    ]
    torch.testing.assert_close(ours(ids), theirs(ids))
