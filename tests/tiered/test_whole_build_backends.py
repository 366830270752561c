"""The whole-model form is compiled by the configured backend's own plugin (its
``compile_region``), in ``precompile(whole=True)`` and in the tiered builder process alike, and
a ``mode`` reaches torch as it does for the regions (torch refuses ``mode`` beside ``options``,
and the whole-model form's guard filter travels in ``options``).

Inductor with ``mode="max-autotune-no-cudagraphs"`` on the small default-config Llama, and a
third-party backend (``counting_aot``: ``aot_eager``, counting its ``compile_region`` calls)
defined here: as a plugin object for ``precompile``, as an installed entry-point plugin for the
builder process (which cannot see a plugin object of the user's process, and says so).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from plugin_site import write_plugin
from tiered_models import tiny_llama

import torchkiln
import torchkiln.tiered
from torchkiln.artifacts.directory import ArtifactError
from torchkiln.artifacts.whole_build import WHOLE_GROUP, whole_config
from torchkiln.artifacts.whole_guards import GuardFilter
from torchkiln.configuration.config import CompileConfig
from torchkiln.plugin import BackendSpec, compile_with_torch, hookimpl
from torchkiln.plugin_host.default_manager import reset_plugin_manager

BUILD_TIMEOUT = 600
ALWAYS = {"enabled": True, "when": "always"}
"""These tests wait for the builder: on this CI's 2 cores ``auto`` would not start it."""
MODE = "max-autotune-no-cudagraphs"

COUNTING_AOT = '''
    """counting_aot: aot_eager, with each compile_region call appended to $COUNTING_AOT_LOG."""
    import os

    from torchkiln.plugin import BackendSpec, compile_with_torch, hookimpl


    @hookimpl
    def declare_backends():
        return [BackendSpec("counting_aot", "aot_eager, counted", modes=(), precompile=True)]


    @hookimpl
    def compile_region(fn, group, config, backend):
        with open(os.environ["COUNTING_AOT_LOG"], "a", encoding="utf-8") as log:
            log.write(f"{os.getpid()} {group.name} fullgraph={config.fullgraph}\\n")
        return compile_with_torch(fn, config, backend="aot_eager")
'''


class CountingAot:
    """The same backend as a plugin object of this process."""

    def __init__(self, precompile: bool = True):
        self.calls: list[tuple[str, bool, bool]] = []
        self.precompile = precompile

    @hookimpl
    def declare_backends(self) -> list[BackendSpec]:
        return [BackendSpec("counting_aot", modes=(), precompile=self.precompile)]

    @hookimpl
    def compile_region(self, fn, group, config, backend):
        guarded = "guard_filter_fn" in config.options
        self.calls.append((group.name, config.fullgraph, guarded))
        return compile_with_torch(fn, config, backend="aot_eager")


@pytest.fixture(autouse=True)
def clean(torchkiln_clean_environment: None, reset_dynamo: None) -> None:
    pass


@pytest.fixture
def installed_counting_aot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``counting_aot`` installed as an entry-point plugin (on ``sys.path``, which the builder
    process gets); yields the log its ``compile_region`` calls append to."""
    site = write_plugin(tmp_path / "site", "counting_aot", COUNTING_AOT)
    log = tmp_path / "compile_region.log"
    log.touch()
    monkeypatch.setenv("COUNTING_AOT_LOG", str(log))
    monkeypatch.syspath_prepend(str(site))
    reset_plugin_manager()
    yield log
    reset_plugin_manager()
    sys.modules.pop("counting_aot", None)


def _logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens).logits


def _switched(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Two regional calls, the build, then the call that switches; its logits."""
    _logits(model, tokens)
    _logits(model, tokens)
    assert torchkiln.tiered.wait(model, BUILD_TIMEOUT)
    out = _logits(model, tokens)
    tiers = torchkiln.tiered.tiers(model)
    assert tiers.serving == "whole-model", tiers.reason
    assert tiers.calls == {"regional": 2, "whole-model": 1}
    return out


# --- the configuration compile_region gets (no compile) ------------------------------------


def test_an_inductor_mode_reaches_torch_as_its_options_beside_the_guard_filter() -> None:
    guard_filter = GuardFilter([])
    config = whole_config(CompileConfig(backend="inductor", mode=MODE), guard_filter)
    assert config.mode is None and config.fullgraph is True
    assert config.options == {
        "max_autotune": True,
        "coordinate_descent_tuning": True,
        "guard_filter_fn": guard_filter,
    }
    plain = whole_config(CompileConfig(backend="aot_eager"), guard_filter)
    assert plain.mode is None and plain.options == {"guard_filter_fn": guard_filter}
    # torch.compile takes what compile_with_torch makes of it (it refuses mode with options)
    compile_with_torch(lambda x: x + 1, config)


def test_a_mode_torch_cannot_express_as_options_is_refused_by_name() -> None:
    with pytest.raises(ArtifactError, match=r"mode 'fast' for backend 'acme'.*not both"):
        whole_config(CompileConfig(backend="acme", mode="fast"), GuardFilter([]))


@pytest.mark.needs_feature("precompiled artifacts")
def test_precompile_whole_refuses_a_backend_that_cannot_save(tokens, tmp_path) -> None:
    with pytest.raises(ArtifactError, match=r"backend 'counting_aot' cannot be precompiled"):
        torchkiln.precompile(
            tiny_llama(),
            tokens,
            tmp_path / "artifacts",
            backend="counting_aot",
            plugins=[CountingAot(precompile=False)],
            whole=True,
        )
    assert not (tmp_path / "artifacts").exists()


# --- a third-party backend ------------------------------------------------------------------


@pytest.mark.needs_feature("precompiled artifacts")
@pytest.mark.needs_feature("tiered compilation")
def test_precompile_whole_compiles_through_the_backends_own_plugin(tokens, tmp_path) -> None:
    plugin = CountingAot()
    result = torchkiln.precompile(
        tiny_llama(),
        tokens,
        tmp_path / "artifacts",
        backend="counting_aot",
        plugins=[plugin],
        kinds=["inference"],
        whole=True,
    )
    assert not result.skipped, result.summary()
    assert [e.kind for e in result.whole] == ["inference"]
    # fullgraph and a guard filter in options: the whole model's, and the regions' saving one
    assert (WHOLE_GROUP, True, True) in plugin.calls
    assert ("LlamaDecoderLayer", True, True) in plugin.calls

    _loads_whole_first(tokens, tmp_path, backend="counting_aot", plugins=[plugin])


def _loads_whole_first(tokens, tmp_path, **options) -> None:
    """A model compiled with the artifact directory serves its first call whole-model, exactly."""
    model = torchkiln.compile(tiny_llama(), artifacts=str(tmp_path / "artifacts"), **options)
    out = _logits(model, tokens)
    tiers = torchkiln.tiered.tiers(model)
    assert (
        tiers.state == "serving"
        and tiers.loaded_from is not None
        and tiers.calls == {"regional": 0, "whole-model": 1}
    ), tiers
    torch.testing.assert_close(out, _logits(tiny_llama(), tokens))


@pytest.mark.slow
@pytest.mark.needs_feature("tiered compilation")
def test_the_builder_compiles_through_an_installed_backend_plugin(
    tokens, installed_counting_aot: Path
) -> None:
    model = torchkiln.compile(tiny_llama(), backend="counting_aot", tiered=ALWAYS)
    out = _switched(model, tokens)
    torch.testing.assert_close(out, _logits(tiny_llama(), tokens))
    calls = [line.split() for line in installed_counting_aot.read_text().splitlines()]
    here = str(os.getpid())
    assert [c[1:] for c in calls if c[0] == here] == [["LlamaDecoderLayer", "fullgraph=False"]]
    elsewhere = [c for c in calls if c[0] != here]  # the builder process
    assert [c[1:] for c in elsewhere] == [["<whole", "model>", "fullgraph=True"]], calls


@pytest.mark.slow
@pytest.mark.needs_feature("tiered compilation")
def test_a_plugin_object_cannot_reach_the_builder_and_the_tiers_say_why(tokens) -> None:
    plugin = CountingAot()
    model = torchkiln.compile(tiny_llama(), backend="counting_aot", plugins=[plugin], tiered=ALWAYS)
    expected = _logits(tiny_llama(), tokens)
    torch.testing.assert_close(_logits(model, tokens), expected)
    assert torchkiln.tiered.wait(model, BUILD_TIMEOUT)
    torch.testing.assert_close(_logits(model, tokens), expected)  # regional, still exact
    tiers = torchkiln.tiered.tiers(model)
    assert tiers.serving == "regional" and tiers.state == "failed", tiers
    assert "backend 'counting_aot' is not declared by any plugin the builder" in tiers.reason
    assert "plugins=[...]" in tiers.reason and "entry point" in tiers.reason
    assert plugin.calls == [("LlamaDecoderLayer", False, False)]  # only the regions, here


# --- inductor with a mode -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.needs_feature("precompiled artifacts")
@pytest.mark.needs_feature("tiered compilation")
def test_precompile_whole_with_an_inductor_mode(tokens, tmp_path) -> None:
    result = torchkiln.precompile(
        tiny_llama(),
        tokens,
        tmp_path / "artifacts",
        backend="inductor",
        mode=MODE,
        kinds=["inference"],
        whole=True,
    )
    assert not result.skipped, result.summary()  # was: "Either mode or options can be ..."
    assert [e.kind for e in result.whole] == ["inference"]
    _loads_whole_first(tokens, tmp_path, backend="inductor", mode=MODE)


@pytest.mark.slow
@pytest.mark.needs_feature("tiered compilation")
def test_tiered_with_an_inductor_mode_switches_to_the_whole_model(tokens) -> None:
    model = torchkiln.compile(tiny_llama(), backend="inductor", mode=MODE, tiered=ALWAYS)
    out = _switched(model, tokens)
    torch.testing.assert_close(out, _logits(tiny_llama(), tokens))
