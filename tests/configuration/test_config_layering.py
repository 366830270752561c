"""Configuration layering: defaults < YAML file < ``TORCHKILN_*`` environment < keyword
arguments, each field remembering where it came from; and the environment parsing rules."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

import torchkiln
from torchkiln._internals.versions import feature_problem
from torchkiln.configuration.config_sources import env_name, leaf_fields
from torchkiln.engine.resolve import resolve_config
from torchkiln.errors import ConfigError
from torchkiln.plugin import RegionPlan, SelectorSpec


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def explicit(resolved: Any) -> dict[str, str]:
    return {path: source for path, source in resolved.sources.items() if source != "default"}


def test_defaults(pm: torchkiln.PluginManager, tmp_path: Path) -> None:
    resolved = resolve_config(plugins=pm, env={}, cwd=tmp_path)
    assert resolved.config == torchkiln.CompileConfig()
    assert resolved.file is None
    assert set(resolved.sources) == {path for path, _ in leaf_fields()}
    assert set(resolved.sources.values()) == {"default"}
    config = resolved.config
    assert (config.backend, config.mode, config.fullgraph, config.dynamic) == (
        "inductor",
        None,
        False,
        None,
    )
    assert (config.regions.strategy, config.distributed.strategy, config.on_region_error) == (
        "auto",
        "none",
        "raise",
    )


def test_every_layer_in_order(pm: torchkiln.PluginManager, tmp_path: Path) -> None:
    config_file = write(
        tmp_path / "site.yaml",
        """
        backend: eager
        fullgraph: true
        progress: "off"
        regions:
          strategy: classes
          classes: [Block]
          min_repeats: 3
        """,
    )
    env = {
        "TORCHKILN_BACKEND": "inductor",
        "TORCHKILN_FULLGRAPH": "no",
        "TORCHKILN_REGIONS_MIN_REPEATS": "4",
        "TORCHKILN_ON_REGION_ERROR": "eager",
    }

    resolved = resolve_config(
        config_file, plugins=pm, env=env, backend="AOT_EAGER", regions={"exclude": ["head"]}
    )

    config = resolved.config
    assert config.backend == "aot_eager"  # argument beats env beats file
    assert config.fullgraph is False  # env beats file
    assert config.progress == "off"  # file beats default
    assert config.regions == torchkiln.configuration.config.RegionsConfig(
        strategy="classes", classes=("Block",), min_repeats=4, exclude=("head",)
    )  # a section merges field by field across layers
    assert config.on_region_error == "eager"
    assert resolved.file == config_file
    where = f"file:{config_file}"
    assert explicit(resolved) == {
        "backend": "argument",
        "fullgraph": "env:TORCHKILN_FULLGRAPH",
        "progress": where,
        "regions.strategy": where,
        "regions.classes": where,
        "regions.min_repeats": "env:TORCHKILN_REGIONS_MIN_REPEATS",
        "regions.exclude": "argument",
        "on_region_error": "env:TORCHKILN_ON_REGION_ERROR",
    }


def test_a_mapping_config_is_a_layer_above_the_environment_and_below_keywords(
    pm: torchkiln.PluginManager,
) -> None:
    env = {"TORCHKILN_BACKEND": "inductor", "TORCHKILN_PROGRESS": "on"}
    resolved = resolve_config(
        {"backend": "eager", "progress": "off"}, plugins=pm, env=env, progress="auto"
    )
    assert (resolved.config.backend, resolved.config.progress) == ("eager", "auto")
    assert explicit(resolved) == {"backend": "argument", "progress": "argument"}


def test_options_mapping_is_replaced_whole_not_merged(
    pm: torchkiln.PluginManager, tmp_path: Path
) -> None:
    config_file = write(
        tmp_path / "o.yaml", "options:\n  max_autotune: true\n  epilogue_fusion: false\n"
    )
    resolved = resolve_config(config_file, plugins=pm, env={}, options={"trace.enabled": True})
    assert resolved.config.options == {"trace.enabled": True}
    assert resolved.sources["options"] == "argument"


def test_options_none_means_no_options_as_in_torch_compile(
    pm: torchkiln.PluginManager, tmp_path: Path
) -> None:
    config_file = write(tmp_path / "o.yaml", "options:\n  max_autotune: true\n")
    resolved = resolve_config(config_file, plugins=pm, env={}, options=None)
    assert resolved.config.options == {}
    assert resolved.sources["options"] == "argument"
    empty = write(tmp_path / "empty.yaml", "options:\nregions:\n  options:\n")
    resolved = resolve_config(empty, plugins=pm, env={})
    assert (resolved.config.options, resolved.config.regions.options) == ({}, {})


def test_torchkiln_config_names_the_file_when_no_path_is_given(
    pm: torchkiln.PluginManager, tmp_path: Path
) -> None:
    config_file = write(tmp_path / "from-env.yaml", "backend: eager\n")
    resolved = resolve_config(plugins=pm, env={"TORCHKILN_CONFIG": str(config_file)}, cwd=tmp_path)
    assert resolved.config.backend == "eager"
    assert resolved.file == config_file
    assert resolved.sources["backend"] == f"file:{config_file}"


def test_an_explicit_path_beats_torchkiln_config(
    pm: torchkiln.PluginManager, tmp_path: Path
) -> None:
    env_file = write(tmp_path / "env.yaml", "backend: eager\nprogress: 'on'\n")
    given = write(tmp_path / "given.yaml", "backend: aot_eager\n")
    resolved = resolve_config(given, plugins=pm, env={"TORCHKILN_CONFIG": str(env_file)})
    assert resolved.file == given
    assert (resolved.config.backend, resolved.config.progress) == (
        "aot_eager",
        "auto",
    )  # env.yaml unread


def test_torchkiln_yaml_in_cwd_is_read(pm: torchkiln.PluginManager, tmp_path: Path) -> None:
    local = write(tmp_path / "torchkiln.yaml", "regions: whole\n")
    resolved = resolve_config(plugins=pm, env={}, cwd=tmp_path)
    assert resolved.file == local
    assert resolved.config.regions.strategy == "whole"
    assert resolved.sources["regions.strategy"] == f"file:{local}"


def test_torchkiln_config_beats_torchkiln_yaml_in_cwd(
    pm: torchkiln.PluginManager, tmp_path: Path
) -> None:
    write(tmp_path / "torchkiln.yaml", "backend: eager\n")
    other = write(tmp_path / "other.yaml", "backend: aot_eager\n")
    resolved = resolve_config(plugins=pm, env={"TORCHKILN_CONFIG": str(other)}, cwd=tmp_path)
    assert (resolved.file, resolved.config.backend) == (other, "aot_eager")


def test_cwd_defaults_to_the_current_directory(pm: torchkiln.PluginManager, tmp_path: Path) -> None:
    # The autouse fixture chdir'ed into tmp_path.
    write(tmp_path / "torchkiln.yaml", "backend: eager\n")
    assert resolve_config(plugins=pm, env={}).config.backend == "eager"


def test_a_compile_config_instance_is_used_as_given(
    pm: torchkiln.PluginManager, tmp_path: Path
) -> None:
    write(tmp_path / "torchkiln.yaml", "backend: bogus\n")  # would be an error if read
    given = torchkiln.CompileConfig(
        backend="eager",
        fullgraph=True,
        regions=torchkiln.configuration.config.RegionsConfig(classes=("Block",)),
    )
    resolved = resolve_config(
        given, plugins=pm, env={"TORCHKILN_BACKEND": "also-bogus"}, cwd=tmp_path
    )
    assert resolved.config == given
    assert resolved.file is None


@pytest.mark.parametrize(
    "how",
    [
        pytest.param({"kwargs": {"regions": "whole"}}, id="keyword"),
        pytest.param({"yaml": "regions: whole\n"}, id="yaml"),
        pytest.param({"env": {"TORCHKILN_REGIONS": "whole"}}, id="env"),
        pytest.param({"env": {"TORCHKILN_REGIONS_STRATEGY": "WHOLE"}}, id="env-field"),
        pytest.param(
            {"kwargs": {"regions": torchkiln.configuration.config.RegionsConfig(strategy="whole")}},
            id="attrs-section",
        ),
    ],
)
def test_regions_shorthand(
    pm: torchkiln.PluginManager, tmp_path: Path, how: dict[str, Any]
) -> None:
    config_file = write(tmp_path / "r.yaml", how["yaml"]) if "yaml" in how else None
    resolved = resolve_config(
        config_file, plugins=pm, env=how.get("env", {}), **how.get("kwargs", {})
    )
    assert resolved.config.regions == torchkiln.configuration.config.RegionsConfig(strategy="whole")


@pytest.mark.parametrize(
    ("kwargs", "env", "yaml"),
    [
        pytest.param({"distributed": "ddp"}, {}, None, id="keyword"),
        pytest.param({}, {"TORCHKILN_DISTRIBUTED": "DDP"}, None, id="env"),
        pytest.param({}, {}, "distributed: ddp\n", id="yaml"),
    ],
)
def test_distributed_shorthand(
    pm: torchkiln.PluginManager,
    tmp_path: Path,
    kwargs: dict[str, Any],
    env: dict[str, str],
    yaml: str | None,
) -> None:
    config_file = write(tmp_path / "d.yaml", yaml) if yaml else None
    config = resolve_config(config_file, plugins=pm, env=env, **kwargs).config
    assert config.distributed.strategy == "ddp"
    assert (
        config.distributed.ddp == torchkiln.configuration.config.DDPConfig()
    )  # the rest stays default


@pytest.mark.parametrize("spelling", ["EAGER", "Eager", "eager", " eager "])
def test_backend_is_case_insensitive(pm: torchkiln.PluginManager, spelling: str) -> None:
    assert resolve_config(plugins=pm, env={"TORCHKILN_BACKEND": spelling}).config.backend == "eager"
    if spelling.strip() == spelling:
        assert resolve_config(plugins=pm, env={}, backend=spelling).config.backend == "eager"


def test_backend_no_turns_compilation_off(pm: torchkiln.PluginManager) -> None:
    config = resolve_config(plugins=pm, env={}, backend="No").config
    assert (config.backend, config.enabled) == ("no", False)
    assert resolve_config(plugins=pm, env={}, disable=True).config.enabled is False


# --- environment parsing rules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("0", False),
        ("False", False),
        ("no", False),
        ("OFF", False),
    ],
)
def test_env_booleans(pm: torchkiln.PluginManager, raw: str, expected: bool) -> None:
    config = resolve_config(plugins=pm, env={"TORCHKILN_FULLGRAPH": raw}).config
    assert config.fullgraph is expected


@pytest.mark.parametrize(
    ("raw", "expected"), [("none", None), ("auto", None), ("", None), ("true", True), ("0", False)]
)
def test_env_dynamic_is_optional(
    pm: torchkiln.PluginManager, raw: str, expected: bool | None
) -> None:
    assert resolve_config(plugins=pm, env={"TORCHKILN_DYNAMIC": raw}).config.dynamic is expected


def test_env_tuples_are_comma_separated_and_mappings_are_json(pm: torchkiln.PluginManager) -> None:
    env = {
        "TORCHKILN_REGIONS_CLASSES": "LlamaDecoderLayer, GPT2Block,",
        "TORCHKILN_OPTIONS": '{"max_autotune": true, "coordinate_descent_tuning": false}',
        "TORCHKILN_DISTRIBUTED_DEEPSPEED_CONFIG": '{"zero_optimization": {"stage": 2}}',
    }
    config = resolve_config(plugins=pm, env=env).config
    assert config.regions.classes == ("LlamaDecoderLayer", "GPT2Block")
    assert config.options == {"max_autotune": True, "coordinate_descent_tuning": False}
    assert config.distributed.deepspeed.config == {"zero_optimization": {"stage": 2}}


def test_env_deepspeed_config_may_be_a_file_path(pm: torchkiln.PluginManager) -> None:
    env = {"TORCHKILN_DISTRIBUTED_DEEPSPEED_CONFIG": "/etc/ds_config.json"}
    assert (
        resolve_config(plugins=pm, env=env).config.distributed.deepspeed.config
        == "/etc/ds_config.json"
    )


# One valid environment string per field, and the value it must produce. The test below
# fails when a field is added without a row here, so every field's variable is exercised.
ENV_VALUES: dict[str, tuple[str, Any]] = {
    "backend": ("aot_eager", "aot_eager"),
    "mode": ("none", None),
    "fullgraph": ("yes", True),
    "dynamic": ("false", False),
    "options": ('{"max_autotune": true}', {"max_autotune": True}),
    "disable": ("on", True),
    "regions.strategy": ("paths", "paths"),
    "regions.classes": ("A,B", ("A", "B")),
    "regions.paths": ("layers.*", ("layers.*",)),
    "regions.exclude": ("head, embed", ("head", "embed")),
    "regions.rest": ("leaves", "leaves"),
    "regions.min_repeats": ("5", 5),
    "regions.options": ('{"min_params": 100}', {"min_params": 100}),
    "distributed.strategy": ("fsdp2", "fsdp2"),
    "distributed.ddp.find_unused_parameters": ("1", True),
    "distributed.ddp.bucket_cap_mb": ("12.5", 12.5),
    "distributed.ddp.broadcast_buffers": ("0", False),
    "distributed.ddp.gradient_as_bucket_view": ("true", True),
    "distributed.ddp.static_graph": ("yes", True),
    "distributed.fsdp2.reshard_after_forward": ("off", False),
    "distributed.fsdp2.replicate_degree": ("4", 4),
    "distributed.fsdp2.mixed_precision.param_dtype": ("bfloat16", "bfloat16"),
    "distributed.fsdp2.mixed_precision.reduce_dtype": ("float32", "float32"),
    "distributed.fsdp2.mixed_precision.output_dtype": ("none", None),
    "distributed.fsdp2.mixed_precision.cast_forward_inputs": ("false", False),
    "distributed.fsdp2.activation_checkpointing": ("on", True),
    "distributed.fsdp2.mesh_device": ("cpu", "cpu"),
    "distributed.fsdp2.dynamo_flags": ("1", True),
    "distributed.deepspeed.config": ("ds.json", "ds.json"),
    "distributed.options": ('{"k": [1, 2]}', {"k": [1, 2]}),
    "tiered.enabled": ("yes", True),
    "tiered.threads": ("2", 2),
    "tiered.when": ("ALWAYS", "always"),
    "tiered.max_slowdown": ("1.5", 1.5),
    "tiered.nice": ("5", 5),
    "job.share": ("ON", "on"),
    "job.timeout": ("90", 90.0),
    "job.store": ("/tmp/kiln-store", "/tmp/kiln-store"),
    "on_region_error": ("EAGER", "eager"),
    "store": ("/tmp/kiln-one-store", "/tmp/kiln-one-store"),
    "cache_dir": ("/tmp/kiln-cache", "/tmp/kiln-cache"),
    "remote_cache": ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
    "artifacts": ("/tmp/kiln-artifacts", "/tmp/kiln-artifacts"),
    "artifacts_strict": ("true", True),
    "progress": ("off", "off"),
    "report": ("true", True),
}

GATED_FIELDS = {"tiered.enabled": "tiered compilation", "artifacts": "precompiled artifacts"}
"""Fields whose ENV_VALUES ask for a feature some supported torch releases lack
(torchkiln._internals.versions.FEATURES)."""


def test_the_env_table_covers_every_field() -> None:
    assert set(ENV_VALUES) == {path for path, _ in leaf_fields()}


class SelectorWithOptions:
    """Declares the selector ``sized``, which takes ``regions.options.min_params``."""

    @torchkiln.hookimpl
    def declare_selectors(self) -> list[SelectorSpec]:
        return [SelectorSpec("sized", options=("min_params",))]

    @torchkiln.hookimpl
    def select_regions(self, model: Any) -> RegionPlan:
        return RegionPlan("sized", ())


@pytest.mark.parametrize("path", sorted(ENV_VALUES))
def test_every_field_has_a_working_env_variable(pm: torchkiln.PluginManager, path: str) -> None:
    raw, expected = ENV_VALUES[path]
    name = env_name(path)
    env = {name: raw}
    if path == "regions.strategy":
        env["TORCHKILN_REGIONS_PATHS"] = "x"  # 'paths' needs globs
    if path == "regions.options":  # only a selector that declares the key accepts it
        pm.register(SelectorWithOptions())
        env["TORCHKILN_REGIONS"] = "sized"
    missing = feature_problem(GATED_FIELDS[path]) if path in GATED_FIELDS else None
    if missing is not None:
        # This torch lacks the feature the value asks for: the refusal is the proof that the
        # variable was read, and names it as the source.
        with pytest.raises(ConfigError) as raised:
            resolve_config(plugins=pm, env=env)
        (problem,) = raised.value.problems
        assert (problem.path, problem.message, problem.source) == (
            f"$.{path}",
            missing,
            f"env:{name}",
        )
        return
    resolved = resolve_config(plugins=pm, env=env)
    value: Any = resolved.config
    for part in path.split("."):
        value = getattr(value, part)
    assert value == expected
    assert resolved.sources[path] == f"env:{name}"


def test_unknown_torchkiln_variables_warn_and_name_what_is_read(
    pm: torchkiln.PluginManager,
) -> None:
    with pytest.warns(RuntimeWarning) as caught:
        resolve_config(plugins=pm, env={"TORCHKILN_BAKEND": "eager"})
    [message] = [str(w.message) for w in caught]
    assert message.startswith(
        "ignoring unknown environment variable(s) TORCHKILN_BAKEND; torchkiln reads: "
    )
    assert "TORCHKILN_BACKEND" in message and "TORCHKILN_STRICT_PLUGINS" in message


def test_plugin_control_variables_are_not_config_fields(
    pm: torchkiln.PluginManager, recwarn: pytest.WarningsRecorder
) -> None:
    env = {
        "TORCHKILN_PLUGINS": "x",
        "TORCHKILN_DISABLED_PLUGINS": "y",
        "TORCHKILN_STRICT_PLUGINS": "1",
        "TORCHKILN_TRACE_PLUGINS": "0",
        "TORCHKILN_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    assert resolve_config(plugins=pm, env=env).config == torchkiln.CompileConfig()
    assert [str(w.message) for w in recwarn] == []


def test_the_process_environment_is_read_by_default(
    pm: torchkiln.PluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHKILN_BACKEND", "eager")
    resolved = resolve_config(plugins=pm)
    assert (resolved.config.backend, resolved.sources["backend"]) == (
        "eager",
        "env:TORCHKILN_BACKEND",
    )
