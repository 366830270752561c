"""Precompiled regions: ``torchkiln.precompile`` writes a store of entries; a new process
loads it through ``torchkiln.compile(model, artifacts=DIR)`` without Dynamo tracing; anything
that does not fit warns (or raises under ``artifacts_strict``) and compiles normally."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

import torchkiln
from torchkiln.artifacts.directory import META, ArtifactError
from torchkiln.artifacts.precompiled import ArtifactWarning
from torchkiln.jobs.entry import ENTRY
from torchkiln.plugin import BackendSpec

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
from precompile_models import inputs, stack  # noqa: E402

# Every test precompiles (or loads what the module fixture precompiled): torch 2.13+ only.
pytestmark = pytest.mark.needs_feature("precompiled artifacts")


@pytest.fixture(autouse=True)
def no_compilation_metrics(fresh_dynamo: None) -> None:
    """After the engine conftest's clean Dynamo and environment: no metrics records left by
    earlier compiles, which :func:`frames_compiled` would count."""
    clear_compilation_metrics()


def frames_compiled() -> int:
    """Frames Dynamo traced since the last :func:`forget_compiles` (loading an inductor
    artifact adds a metrics record without a frame: not counted)."""
    return len([m for m in get_compilation_metrics() if m.co_name])


def forget_compiles() -> None:
    torch._dynamo.reset()
    clear_compilation_metrics()


def entries(directory: Path) -> list[Path]:
    return sorted(p for p in (directory / "entries").iterdir() if not p.name.startswith("."))


def metas(directory: Path) -> list[dict[str, Any]]:
    return [json.loads((entry / META).read_text()) for entry in entries(directory)]


def test_each_entry_is_keyed_by_its_group_and_call(artifacts: Path) -> None:
    fields = [meta["fields"] for meta in metas(artifacts)]
    for field in fields:
        assert (field["torch"], field["backend"], field["device"], field["dtype"]) == (
            torch.__version__,
            "aot_eager",
            "cpu",
            "float32",
        )
        assert (field["group"], field["class"]) == ("Block", "precompile_models.Block")
        assert len(field["code"]) == len(field["structure"]) == 64
    # Training: the first block's input needs no grad, the others' do (one entry each).
    assert sorted((f["kind"], f["inputs"]) for f in fields) == [
        ("inference", ["Tensor[2, 4, 16] float32"]),
        ("training", ["Tensor[2, 4, 16] float32"]),
        ("training", ["Tensor[2, 4, 16] float32 grad"]),
    ]
    for entry in entries(artifacts):
        assert (entry / ENTRY).stat().st_size > 0


LOADER = textwrap.dedent(
    """
    import json, sys, warnings
    import torch
    from torch._dynamo.utils import get_compilation_metrics
    import torchkiln
    from precompile_models import inputs, stack

    from torchkiln.artifacts.precompiled import ArtifactWarning

    warnings.simplefilter("error", ArtifactWarning)  # artifacts that do not fit fail the run
    directory, backend = sys.argv[1], sys.argv[2]
    model = torchkiln.compile(stack(), backend=backend, artifacts=directory, progress="off")
    x = inputs()
    with torch.no_grad():
        inference = model(x)
    model.train()
    x_grad = x.clone().requires_grad_()
    training = model(x_grad)
    training.sum().backward()
    frames = len([m for m in get_compilation_metrics() if m.co_name])
    grads = [p.grad.clone() for p in model.parameters()]
    torchkiln.decompile(model)
    model.zero_grad()
    expected = model(x.clone().requires_grad_())
    expected.sum().backward()
    print(json.dumps({
        "frames": frames,
        "inference": (inference - expected).abs().max().item(),
        "training": (training - expected).abs().max().item(),
        "grads": max((g - p.grad).abs().max().item() for g, p in zip(grads, model.parameters())),
    }))
    """
)


def run_script(code: str, *args: str, **env: str) -> dict[str, Any]:
    """Run ``code`` in a new Python process (tests/ importable, ``env`` added to the
    environment); the JSON object its last line prints."""
    environment = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        **env,
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run_loader(directory: Path, backend: str = "aot_eager") -> dict[str, Any]:
    return run_script(LOADER, str(directory), backend)


def test_a_new_process_runs_inference_and_training_without_tracing(artifacts: Path) -> None:
    result = run_loader(artifacts)
    assert result["frames"] == 0  # Dynamo traced nothing: every block ran a loaded function
    assert result["inference"] < 1e-5 and result["training"] < 1e-5 and result["grads"] < 1e-5


def test_a_decorated_forward_is_saved_and_loaded(tmp_path: Path) -> None:
    """The transformers trap: pickling a decorated forward by reference fails; torchkiln hands
    it to torch's pickler as external data instead."""
    model = stack(decorated=True)
    result = torchkiln.precompile(
        model, inputs(), tmp_path, backend="aot_eager", kinds=["inference"]
    )
    assert result.skipped == [] and result.entries == 1
    forget_compiles()
    fresh = torchkiln.compile(stack(decorated=True), backend="aot_eager", artifacts=str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ArtifactWarning)
        with torch.no_grad():
            out = fresh(inputs())
    assert frames_compiled() == 0
    torch.testing.assert_close(out, stack(decorated=True)(inputs()))


def _compiled(artifacts: Path, **options: object) -> torch.nn.Module:
    return torchkiln.compile(
        stack(), backend="aot_eager", artifacts=str(artifacts), progress="off", **options
    )


def test_a_call_the_artifacts_do_not_fit_warns_once_and_compiles(artifacts: Path) -> None:
    model = _compiled(artifacts)
    other = inputs(batch=5)
    fits = pytest.warns(ArtifactWarning, match=r"does not fit this call .*size mismatch")
    with fits as caught, torch.no_grad():
        out = model(other)
        model(other)
    assert len(caught) == 1
    assert frames_compiled() >= 1  # compiled normally, once, for the new shape
    torchkiln.decompile(model)
    with torch.no_grad():
        torch.testing.assert_close(out, model(other))


def test_the_report_names_where_each_group_s_code_came_from(artifacts: Path) -> None:
    model = _compiled(artifacts)
    assert torchkiln.report(model).served_from == ("Block: pending",)
    with torch.no_grad():
        model(inputs())  # fits: 3 blocks, one group, no frame traced
        model(inputs())
    assert frames_compiled() == 0
    line = (
        f"Block: serving from artifacts {artifacts} (3 functions: inference, training): 6 calls fit"
    )
    assert torchkiln.report(model).served_from == (line,)
    with pytest.warns(ArtifactWarning), torch.no_grad():
        model(inputs(batch=5))  # fits none: the backend compiles the group for it
    assert frames_compiled() >= 1
    served = torchkiln.report(model).served_from[0]
    head, *missed = served.splitlines()
    assert head.endswith("6 calls fit; 3 ran the backend's code")
    # The 3 block calls missed for one reason, the first failing guard of each function.
    assert len(missed) == 1 and missed[0].startswith("    missed 3: inference: tensor"), missed
    assert "expected 2, actual 5" in missed[0]
    assert f"code of group {served}" in str(torchkiln.report(model))


def test_a_changed_module_attribute_is_caught_by_the_guards(artifacts: Path) -> None:
    model = _compiled(artifacts)
    for block in model.blocks:
        block.scale = 0.0
    with pytest.warns(ArtifactWarning, match="does not fit"), torch.no_grad():
        out = model(inputs())
    torchkiln.decompile(model)
    with torch.no_grad():
        torch.testing.assert_close(out, model(inputs()))


def test_inference_only_artifacts_in_training_mode_compile_normally(tmp_path: Path) -> None:
    torchkiln.precompile(stack(), inputs(), tmp_path, backend="aot_eager", kinds=["inference"])
    forget_compiles()
    model = torchkiln.compile(stack(), backend="aot_eager", artifacts=str(tmp_path)).train()
    with pytest.warns(ArtifactWarning, match="grad_mode"):
        model(inputs()).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_strict_turns_a_call_mismatch_into_an_error(artifacts: Path) -> None:
    model = _compiled(artifacts, artifacts_strict=True)
    with pytest.raises(ArtifactError, match="artifacts_strict"), torch.no_grad():
        model(inputs(batch=5))


def test_another_dtype_warns_at_compile_and_compiles_normally(artifacts: Path) -> None:
    with pytest.warns(ArtifactWarning, match=r"dtype: precompiled with 'float32', now 'float64'"):
        model = torchkiln.compile(stack().double(), backend="aot_eager", artifacts=str(artifacts))
    with torch.no_grad():
        model(inputs().double())
    assert frames_compiled() >= 1


def test_strict_rejects_another_backend_option_at_compile(artifacts: Path) -> None:
    with pytest.raises(ArtifactError, match=r"dynamic: precompiled with None, now False"):
        torchkiln.compile(
            stack(),
            backend="aot_eager",
            dynamic=False,
            artifacts=str(artifacts),
            artifacts_strict=True,
        )


def test_changed_code_is_refused(artifacts: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(artifacts, copy)
    for entry in entries(copy):
        data = json.loads((entry / META).read_text())
        data["fields"]["code"] = "0" * 64
        (entry / META).write_text(json.dumps(data))
    with pytest.warns(ArtifactWarning, match="group 'Block': the source of the group's classes"):
        model = torchkiln.compile(stack(), backend="aot_eager", artifacts=str(copy))
    with torch.no_grad():
        model(inputs())
    assert frames_compiled() >= 1


def test_a_missing_directory_warns_and_a_corrupt_entry_is_refused(
    artifacts: Path, tmp_path: Path
) -> None:
    with pytest.warns(ArtifactWarning, match="holds no precompiled entries"):
        torchkiln.compile(stack(), backend="aot_eager", artifacts=str(tmp_path / "nowhere"))
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(artifacts, copy)
    for entry in entries(copy):
        (entry / ENTRY).write_bytes(b"not a pickle")
    with pytest.warns(ArtifactWarning, match="does not match the manifest"):
        torchkiln.compile(stack(), backend="aot_eager", artifacts=str(copy))


def test_a_directory_of_the_older_format_says_to_precompile_again(tmp_path: Path) -> None:
    """manifest.json and groups/ (what precompile wrote before it wrote a store): refused by
    name, at compile, and as an output."""
    (tmp_path / "manifest.json").write_text('{"format": 2, "environment": {}, "groups": []}')
    (tmp_path / "groups").mkdir()
    with pytest.warns(ArtifactWarning, match=r"older torchkiln .*re-run `torchkiln precompile`"):
        model = torchkiln.compile(stack(), backend="aot_eager", artifacts=str(tmp_path))
    with torch.no_grad():
        torch.testing.assert_close(model(inputs()), stack()(inputs()))
    with pytest.raises(ArtifactError, match="older torchkiln"):
        torchkiln.compile(
            stack(), backend="aot_eager", artifacts=str(tmp_path), artifacts_strict=True
        )
    with pytest.raises(ArtifactError, match="is not empty and is not a torchkiln store"):
        torchkiln.precompile(stack(), inputs(), tmp_path, backend="aot_eager")


def test_a_backend_that_cannot_serialise_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"backend 'eager' cannot be precompiled.*BackendSpec"):
        torchkiln.precompile(stack(), inputs(), tmp_path, backend="eager")


def test_a_vendor_backend_without_precompile_is_reported_not_broken(
    artifacts: Path, torchkiln_plugin_manager: torchkiln.PluginManager
) -> None:
    class Vendor:
        @torchkiln.hookimpl
        def declare_backends(self) -> list[BackendSpec]:
            return [BackendSpec("vendorx", "a vendor backend")]

        @torchkiln.hookimpl
        def compile_region(self, fn, group, config, backend):  # type: ignore[no-untyped-def]
            return torch.compile(fn, backend="eager") if backend == "vendorx" else None

    pm = torchkiln_plugin_manager
    pm.register(Vendor(), name="vendorx")
    with pytest.warns(ArtifactWarning, match=r"backend 'vendorx' does not declare"):
        model = torchkiln.compile(stack(), backend="vendorx", artifacts=str(artifacts), plugins=pm)
    with torch.no_grad():
        torch.testing.assert_close(model(inputs()), stack()(inputs()))
    with pytest.raises(ArtifactError, match="plugin 'vendorx' does not declare"):
        torchkiln.precompile(
            stack(), inputs(), artifacts.parent / "v", backend="vendorx", plugins=pm
        )


def test_precompile_refuses_bad_requests(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="kinds"):
        torchkiln.precompile(stack(), inputs(), tmp_path, kinds=["serving"])
    compiled = torchkiln.compile(stack(), backend="aot_eager")
    with pytest.raises(ArtifactError, match="plain model"):
        torchkiln.precompile(compiled, inputs(), tmp_path)
    with pytest.raises(ArtifactError, match="hierarchical"):
        torchkiln.precompile(stack(), inputs(), tmp_path, regions="hierarchical")


def test_precompile_keeps_the_model_modes(tmp_path: Path) -> None:
    model = stack().eval()
    model.blocks[1].train()
    before = [m.training for m in model.modules()]
    torchkiln.precompile(model, inputs(), tmp_path, backend="aot_eager")
    assert [m.training for m in model.modules()] == before
    assert torch.is_grad_enabled()


def test_the_cli_writes_the_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from torchkiln.cli import commands as cli

    code = cli.main(
        [
            "precompile",
            "precompile_models:stack",
            "--output",
            str(tmp_path),
            "--backend",
            "aot_eager",
            "--kinds",
            "inference",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Block, inference" in out
    assert [meta["kind"] for meta in metas(tmp_path)] == ["inference"]


def test_the_docs_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (TESTS.parent / "docs" / "precompile.md").read_text(encoding="utf-8")
    (code,) = re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/precompile.md", "exec"), {"__name__": "__main__"})
    assert entries(tmp_path / "kiln-artifacts")


def test_the_artifacts_field_comes_from_the_environment(
    artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHKILN_ARTIFACTS", str(artifacts))
    model = torchkiln.compile(stack(), backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ArtifactWarning)
        with torch.no_grad():
            torch.testing.assert_close(model(inputs()), stack()(inputs()))
    assert frames_compiled() == 0


INDUCTOR_LOADER = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch._dynamo.utils import counters, get_compilation_metrics
    from torch._inductor import cpu_vec_isa
    import torchkiln
    from precompile_models import inputs, stack

    probe_children = []  # inductor's ISA probe: one child process per dlopen check
    real_probe_load = cpu_vec_isa.VecISA._probe_load
    def counted(isa, path):
        probe_children.append(str(isa))
        return real_probe_load(isa, path)
    cpu_vec_isa.VecISA._probe_load = counted

    model = torchkiln.compile(stack(), artifacts=sys.argv[1], artifacts_strict=True)
    with torch.no_grad():
        out = model(inputs())
    # Every call fit: the fallback torch.compile wrapper was never built, so inductor's
    # compile stack was never imported.
    compile_stack = "torch._inductor.compile_fx" in sys.modules
    from torch._inductor.select_algorithm import TritonTemplate
    from torchkiln.artifacts.deferred_templates import DeferredTemplate
    templates = [t.template for t in TritonTemplate.all_templates.values()]
    deferred = all(isinstance(t, DeferredTemplate) and t._parsed is None for t in templates)
    torchkiln.decompile(model)
    with torch.no_grad():
        expected = model(inputs())
    print(json.dumps({
        "compile_stack_imported": compile_stack,
        "templates_deferred": deferred and len(templates) > 0,
        "frames": len([m for m in get_compilation_metrics() if m.co_name]),
        "fxgraph_misses": counters["inductor"]["fxgraph_cache_miss"],
        "diff": (out - expected).abs().max().item(),
        "probe_children": len(probe_children),
        "isa": str(cpu_vec_isa.pick_vec_isa()),
    }))
    """
)


def _load_in_new_process(
    directory: Path, cache: Path, compiler: Path, calls: Path
) -> tuple[dict[str, object], list[str]]:
    """Load ``directory`` in a new process with the empty inductor cache ``cache``; its result
    and the C++ files it compiled (through the logging ``compiler``)."""
    calls.unlink(missing_ok=True)
    result = run_script(
        INDUCTOR_LOADER, str(directory), TORCHINDUCTOR_CACHE_DIR=str(cache), CXX=str(compiler)
    )
    compiled = [c for c in calls.read_text().splitlines() if ".cpp" in c] if calls.exists() else []
    return result, compiled


@pytest.mark.slow  # two inductor compiles of a small block, then two new processes load it
def test_inductor_artifacts_load_in_a_new_process_with_an_empty_cache(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # The same compiler in every process (it is part of inductor's kernel keys): a wrapper
    # that records every call, then runs the real one.
    calls = tmp_path / "compiler-calls.txt"
    compiler = tmp_path / "logged-g++"
    compiler.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec g++ "$@"\n')
    compiler.chmod(0o755)
    import torch._inductor.config as inductor_config

    # config.patch, not monkeypatch.setattr: undoing a monkeypatch on the ``cpp`` proxy
    # deletes the setting, and every later inductor compile in the process then fails with
    # "torch._inductor.config.cpp.cxx does not exist" (the CI run of stop 26).
    patch = inductor_config.patch({"cpp.cxx": (None, str(compiler))})
    patch.__enter__()
    request.addfinalizer(lambda: patch.__exit__(None, None, None))
    # This process compiles the same blocks first: inductor has then probed the CPU and holds
    # the kernels in memory, and the precompile must still put everything into DIR/kernels.
    earlier = torchkiln.compile(stack(), progress="off")
    with torch.no_grad():
        earlier(inputs())
    torchkiln.decompile(earlier)
    directory = tmp_path / "artifacts"
    result = torchkiln.precompile(stack(), inputs(), directory, kinds=["inference"])
    (meta,) = metas(directory)
    assert result.skipped == [] and meta["fields"]["backend"] == "inductor"
    assert any(directory.rglob("*.so"))  # the compiled C++ kernels travel along
    assert ".cpp" in calls.read_text()  # the precompile did compile C++ through the wrapper
    record = meta["cpu_isa"]
    assert record is not None and record["probes"] and all(record["probes"].values())
    # The probe's test libraries travel, not the marks of their load check (torch 2.14+
    # writes ``<library>.load_ok`` and then trusts it): the loading machine loads them itself.
    assert not any(k["file"].endswith(".load_ok") for k in meta["kernels"])
    assert not any(directory.rglob("*.load_ok"))

    # Same CPU and compiler: the ISA probe is answered from the record, no child is started.
    loaded, compiled = _load_in_new_process(directory, tmp_path / "cache-1", compiler, calls)
    assert loaded["frames"] == 0 and loaded["fxgraph_misses"] == 0
    assert loaded["compile_stack_imported"] is False
    assert loaded["templates_deferred"] is True  # parsed on first use: none was used
    assert loaded["diff"] < 1e-5
    assert compiled == []  # no C++ compile: the kernels came from the artifacts
    assert loaded["probe_children"] == 0
    assert any((tmp_path / "cache-1").rglob("*.so"))

    # Another compiler version recorded: the probe runs as usual (its test libraries came
    # with the artifacts, so it still compiles nothing, but loads each in a child, here) and
    # picks the same ISA.
    (entry,) = entries(directory)
    meta["cpu_isa"]["compiler"] = "g++=some other version"
    (entry / META).write_text(json.dumps(meta))
    probed, compiled = _load_in_new_process(directory, tmp_path / "cache-2", compiler, calls)
    assert probed["probe_children"] > 0
    assert compiled == [] and probed["fxgraph_misses"] == 0 and probed["diff"] < 1e-5
    assert probed["isa"] == loaded["isa"]


def test_a_transformers_decoder_with_its_kv_cache_loads_without_tracing(tmp_path: Path) -> None:
    """The default Llama config (use_cache on): each layer gets its cache view through the
    transformers adapter's preparation, and the precompiled function updates it."""
    pytest.importorskip("transformers")
    from torchkiln.examples import example_inputs, llama

    ids = example_inputs(llama(depth=2), 1, 16)
    result = torchkiln.precompile(
        llama(depth=2), ids, tmp_path, backend="aot_eager", kinds=["inference"]
    )
    assert result.skipped == [] and result.entries == 1
    forget_compiles()
    model = torchkiln.compile(llama(depth=2), backend="aot_eager", artifacts=str(tmp_path))
    assert model.config.use_cache
    with warnings.catch_warnings():
        warnings.simplefilter("error", ArtifactWarning)
        with torch.no_grad():
            out = model(ids)
    assert frames_compiled() == 0
    torchkiln.decompile(model)
    with torch.no_grad():
        expected = model(ids)
    torch.testing.assert_close(out.logits, expected.logits)
    for layer in range(2):  # the cache the loaded function filled is the eager one
        torch.testing.assert_close(
            out.past_key_values.layers[layer].keys, expected.past_key_values.layers[layer].keys
        )


KV_CACHE_LOADER = textwrap.dedent(
    """
    import json, sys
    import torch
    import torchkiln
    from torchkiln.examples import example_inputs, llama

    # A new process has built no cache view yet: unpickling the guards must find the class.
    model = llama(depth=2)
    ids = example_inputs(model, 1, 16)
    model = torchkiln.compile(
        model, backend="aot_eager", artifacts=sys.argv[1], artifacts_strict=True, progress="off"
    )
    with torch.no_grad():
        out = model(ids)
    torchkiln.decompile(model)
    with torch.no_grad():
        diff = (out.logits - model(ids).logits).abs().max().item()
    frames = len([m for m in torch._dynamo.utils.get_compilation_metrics() if m.co_name])
    print(json.dumps({"frames": frames, "diff": diff}))
    """
)


def test_a_kv_cache_view_class_is_found_by_a_new_process_loading_the_artifacts(
    tmp_path: Path,
) -> None:
    """The guards name the generated view class (``DynamicCacheLayerView``); a new process
    has not generated it when it loads (the bench's precompiled cell failed on this)."""
    pytest.importorskip("transformers")
    from torchkiln.examples import example_inputs, llama

    ids = example_inputs(llama(depth=2), 1, 16)
    torchkiln.precompile(llama(depth=2), ids, tmp_path, backend="aot_eager", kinds=["inference"])
    result = run_script(KV_CACHE_LOADER, str(tmp_path))
    assert result["frames"] == 0 and result["diff"] < 1e-5
