"""``torchkiln.compat.accelerate.install()``: an unmodified ``Accelerator`` compiles with
torchkiln, and ``uninstall()`` puts back exactly what it replaced."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate_helpers import compiled_graphs, llama_model, token_ids
from accelerate_training import compare

import torchkiln
from torchkiln.compat import accelerate as kiln
from torchkiln.compat.accelerate_install import REPLACED, launcher_dynamic_unforced
from torchkiln.engine.double_compile import DoubleCompileError, DoubleCompileWarning

accelerate_other = pytest.importorskip("accelerate.utils.other")
pytest.importorskip("accelerate.accelerator")
ORIGINALS = {name: getattr(accelerate_other, name) for name in REPLACED}  # before any install()


@pytest.fixture(autouse=True)
def never_left_installed() -> Iterator[None]:
    yield
    kiln.uninstall()


def bindings() -> dict[tuple[str, str], Any]:
    """Every attribute of a loaded ``accelerate`` module that holds one of Accelerate's own
    helpers that install() replaces."""
    originals = {id(function) for function in ORIGINALS.values()}
    return {
        (module_name, attribute): value
        for module_name, module in list(sys.modules.items())
        if module_name == "accelerate" or module_name.startswith("accelerate.")
        for attribute, value in list(vars(module).items())
        if id(value) in originals
    }


def test_install_replaces_every_binding_and_uninstall_restores_the_same_objects() -> None:
    before = bindings()
    bound_in = {module for module, _ in before}
    # The three modules that bind the helpers at import time, and the public namespace.
    assert {
        "accelerate.accelerator",
        "accelerate.utils",
        "accelerate.utils.other",
        "accelerate.utils.fsdp_utils",
    } <= bound_in
    assert ("accelerate.accelerator", "compile_regions_fsdp2") in before

    installation = kiln.install()
    assert kiln.is_installed() and installation.owner
    assert bindings() == {}  # none of Accelerate's helpers is reachable any more
    accelerator_module = sys.modules["accelerate.accelerator"]
    assert accelerator_module.compile_regions is installation.replacements["compile_regions"]
    assert (
        accelerator_module.extract_model_from_parallel
        is (installation.replacements["extract_model_from_parallel"])
    )
    assert {(b.module.__name__, b.name) for b in installation.bindings} == set(before)

    assert kiln.uninstall() is True
    after = bindings()
    assert after.keys() == before.keys()
    assert all(after[key] is before[key] for key in before)  # the very same objects
    assert not kiln.is_installed() and kiln.uninstall() is False


def test_install_is_idempotent_and_a_context_manager() -> None:
    before = bindings()
    with kiln.install() as outer:
        replaced = {(b.module.__name__, b.name): b.module.__dict__[b.name] for b in outer.bindings}
        with kiln.install() as inner:  # a second install changes nothing ...
            assert not inner.owner
            assert {
                (b.module.__name__, b.name): b.module.__dict__[b.name] for b in outer.bindings
            } == replaced
        assert kiln.is_installed()  # ... and leaving its block keeps the first one
    assert not kiln.is_installed()
    assert all(bindings()[key] is value for key, value in before.items())


def test_uninstall_also_restores_modules_that_bound_a_replacement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ``accelerate`` module imported after install() binds the replacement; uninstall()
    gives it Accelerate's original too."""
    installation = kiln.install()
    late = types.ModuleType("accelerate._late_import_probe")
    late.compile_regions = sys.modules["accelerate.utils.other"].compile_regions
    monkeypatch.setitem(sys.modules, late.__name__, late)
    assert late.compile_regions is installation.replacements["compile_regions"]
    kiln.uninstall()
    assert late.compile_regions is ORIGINALS["compile_regions"]


@pytest.mark.usefixtures("fresh_accelerate")
def test_accelerator_trains_with_torchkiln_like_accelerates_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """prepare -> 2 steps -> unwrap_model -> get_state_dict / save_model, with Accelerate's own
    regional compile and then with install(), from the same initial weights."""
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "EAGER")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "1")
    result = compare(tmp_path)
    theirs, ours = result["accelerate"], result["torchkiln"]
    assert result["dynamo"]["use_regional_compilation"] is True

    assert ours["block_classes"] == ["LlamaDecoderLayer"]  # blocks keep their own class
    assert ours["unwrapped_is_model"] and ours["prepared_type"] == "LlamaForCausalLM"
    assert ours["orig_mod_keys"] == []
    assert ours["state_dict_load"] == {"ok": True, "same_logits": True}
    assert ours["save_model_load"] == {"ok": True, "same_logits": True}
    assert ours["regions"] == [
        ["model.layers.0", "compiled"],
        ["model.layers.1", "compiled"],
        ["model.embed_tokens", "compiled"],
        ["model.norm", "compiled"],
        ["lm_head", "compiled"],
    ]
    # The same training step as Accelerate's own regional compile ...
    torch.testing.assert_close(ours["losses"], theirs["losses"], rtol=1e-6, atol=1e-6)
    assert ours["weight_sum"] == pytest.approx(theirs["weight_sum"], rel=1e-6)
    # ... whose checkpoint does not load into the plain model (21 "_orig_mod." keys).
    assert theirs["block_classes"] == ["OptimizedModule"] and len(theirs["orig_mod_keys"]) == 21
    assert theirs["state_dict_load"]["ok"] is False


@pytest.mark.usefixtures("fresh_accelerate")
@pytest.mark.parametrize("policy", ["warn", "raise"])
def test_prepare_does_not_compile_a_torchkiln_model_again(
    monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    from accelerate import Accelerator
    from accelerate.utils import TorchDynamoPlugin

    if policy == "raise":
        monkeypatch.setenv("TORCHKILN_ON_DOUBLE_COMPILE", "raise")
    model = torchkiln.compile(llama_model(), backend="eager")
    model(token_ids())
    graphs = compiled_graphs()
    plugin = TorchDynamoPlugin(backend="eager", use_regional_compilation=True)
    with kiln.install():
        accelerator = Accelerator(cpu=True, dynamo_plugin=plugin)
        if policy == "raise":
            with pytest.raises(DoubleCompileError, match="TORCHKILN_ON_DOUBLE_COMPILE=raise"):
                accelerator.prepare(model)
            return
        with pytest.warns(DoubleCompileWarning, match=r"dynamo_backend='no'") as caught:
            prepared = accelerator.prepare(model)
    message = str(caught[0].message)
    assert "compile_regions(backend='eager') was asked to compile a model" in message
    # install() is in effect: the advice is not to call it (issue 41)
    assert "install() is in effect" in message and "or call torchkiln.compat" not in message
    assert prepared is model and "_orig_mod" not in model.__dict__
    prepared(token_ids())
    assert compiled_graphs() == graphs  # nothing compiled a second time


@pytest.mark.usefixtures("fresh_accelerate")
def test_preparing_twice_is_no_double_compile() -> None:
    import warnings

    from accelerate import Accelerator
    from accelerate.utils import TorchDynamoPlugin

    plugin = TorchDynamoPlugin(backend="eager", use_regional_compilation=True)
    with kiln.install():
        accelerator = Accelerator(cpu=True, dynamo_plugin=plugin)
        model = accelerator.prepare(llama_model())
        with warnings.catch_warnings():
            warnings.simplefilter("error", DoubleCompileWarning)
            assert accelerator.prepare(model) is model
    assert torchkiln.is_compiled(model)


def test_is_compiled_module_as_accelerate_asks_it() -> None:
    """Accelerate reads ``model._orig_mod`` whenever ``is_compiled_module(model)`` is true."""
    with kiln.install() as installation:
        is_compiled_module = installation.replacements["is_compiled_module"]
        whole = torchkiln.compile(torch.nn.Linear(4, 4), backend="eager")
        assert kiln.is_compiled_module(whole) and not is_compiled_module(whole)
        via_compile_regions = kiln.compile_regions(torch.nn.Linear(4, 4), backend="eager")
        assert is_compiled_module(via_compile_regions)
        assert via_compile_regions._orig_mod is via_compile_regions
        assert not is_compiled_module(kiln.compile_regions(llama_model(), backend="eager"))
        assert is_compiled_module(torch.compile(torch.nn.Linear(4, 4), backend="eager"))


def test_launcher_exported_false_dynamic_is_not_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    assert launcher_dynamic_unforced({"dynamic": False}) == {"dynamic": False}
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "False")
    assert launcher_dynamic_unforced({"backend": "eager", "dynamic": False}) == {
        "backend": "eager",
        "dynamic": None,
    }
    assert launcher_dynamic_unforced({"dynamic": True}) == {"dynamic": True}


def test_install_rejects_a_bad_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHKILN_ON_DOUBLE_COMPILE", "loud")
    with pytest.raises(
        torchkiln.ConfigError,
        match=r"'loud' is not a double-compile policy; allowed: warn, raise, off",
    ):
        kiln.install()
    assert not kiln.is_installed()


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_accelerate")
def test_mixed_precision_prepare_runs_the_compiled_regions_under_autocast() -> None:
    """``mixed_precision="bf16"``: prepare wraps forward in autocast, then compiles; the
    regions run under autocast, and unwrapping without the wrapper leaves the model as is."""
    from accelerate import Accelerator
    from accelerate.utils import TorchDynamoPlugin

    model = llama_model()
    seen: list[torch.dtype] = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    plugin = TorchDynamoPlugin(backend="eager", use_regional_compilation=True)
    with kiln.install():
        accelerator = Accelerator(cpu=True, mixed_precision="bf16", dynamo_plugin=plugin)
        prepared = accelerator.prepare(model)
        logits = prepared(token_ids()).logits
        plain = accelerator.unwrap_model(prepared, keep_fp32_wrapper=False)
    assert seen == [torch.bfloat16] and logits.dtype == torch.float32  # Accelerate's fp32 output
    assert compiled_graphs() >= 4  # the block graph and the three leaves: the regions ran
    statuses = [r["status"] for r in torchkiln.report(model).to_dict()["regions"]]
    assert statuses == ["compiled"] * 5
    assert plain is not model and "_original_forward" in model.__dict__  # still mixed precision
    assert "_original_forward" not in plain.__dict__
