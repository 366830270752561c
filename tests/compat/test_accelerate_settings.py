"""Accelerate's ACCELERATE_DYNAMO_* variables and config file, mapped onto CompileConfig by the
built-in ``torchkiln.accelerate_config`` plugin."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchkiln.compat.accelerate_settings import (
    DynamoBackend,
    read_env,
    read_yaml,
    to_overrides,
    torchkiln_backend,
)
from torchkiln.engine.resolve import ResolvedConfig, resolve_config
from torchkiln.errors import ConfigError

PLUGIN = "plugin:torchkiln.accelerate_config"

# Every one of Accelerate's sixteen names, and the torchkiln backend it becomes (None: none).
EXPECTED_BACKENDS = {
    "NO": "no",
    "EAGER": "eager",
    "AOT_EAGER": "aot_eager",
    "INDUCTOR": "inductor",
    "AOT_TS_NVFUSER": None,
    "NVPRIMS_NVFUSER": None,
    "CUDAGRAPHS": "cudagraphs",
    "OFI": None,
    "FX2TRT": "tensorrt",
    "ONNXRT": None,
    "TENSORRT": "tensorrt",
    "AOT_TORCHXLA_TRACE_ONCE": "xla",
    "TORCHXLA_TRACE_ONCE": "xla_inference",
    "TVM": "tvm",
    "HPU_BACKEND": "hpu",
    "NEURON": "neuron",
}


def resolve(monkeypatch: pytest.MonkeyPatch, **env: str) -> ResolvedConfig:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return resolve_config()


def test_the_enum_has_accelerates_sixteen_members() -> None:
    assert [m.value for m in DynamoBackend] == list(EXPECTED_BACKENDS)


@pytest.mark.parametrize("name", list(EXPECTED_BACKENDS))
def test_each_accelerate_backend_maps_or_says_why_not(name: str) -> None:
    expected = EXPECTED_BACKENDS[name]
    for spelling in (name, name.lower(), name.title()):
        member = DynamoBackend(spelling)
        if expected is not None:
            assert torchkiln_backend(member) == expected
            continue
        with pytest.raises(ConfigError) as error:
            torchkiln_backend(member, "$.backend", "env:ACCELERATE_DYNAMO_BACKEND")
        message = str(error.value)
        assert f"Accelerate's dynamo backend {name!r} has no torchkiln backend" in message
        assert "Accelerate names that map: no, eager, aot_eager, inductor" in message
        assert "(from env:ACCELERATE_DYNAMO_BACKEND)" in message


@pytest.mark.parametrize("spelling", ["aot_eager", "AOT_EAGER", "Aot_Eager"])
def test_backend_variable_is_case_insensitive(
    monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    resolved = resolve(monkeypatch, ACCELERATE_DYNAMO_BACKEND=spelling)
    assert resolved.config.backend == "aot_eager"
    assert resolved.sources["backend"] == PLUGIN


def test_all_five_variables_map(monkeypatch: pytest.MonkeyPatch) -> None:
    resolved = resolve(
        monkeypatch,
        ACCELERATE_DYNAMO_BACKEND="INDUCTOR",
        ACCELERATE_DYNAMO_MODE="reduce-overhead",
        ACCELERATE_DYNAMO_USE_FULLGRAPH="True",
        ACCELERATE_DYNAMO_USE_DYNAMIC="yes",
        ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION="1",
    )
    config = resolved.config
    assert (config.backend, config.mode, config.fullgraph, config.dynamic) == (
        "inductor",
        "reduce-overhead",
        True,
        True,
    )
    assert (config.regions.strategy, config.regions.rest) == ("repeated", "leaves")
    for path in ("backend", "mode", "fullgraph", "dynamic", "regions.strategy", "regions.rest"):
        assert resolved.sources[path] == PLUGIN


def test_what_accelerate_launch_exports_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """`accelerate launch --dynamo_backend aot_eager` exports all five; mode `default` and
    `USE_DYNAMIC=False` are launcher defaults, not choices: mode and dynamic stay unset."""
    resolved = resolve(
        monkeypatch,
        ACCELERATE_DYNAMO_BACKEND="AOT_EAGER",
        ACCELERATE_DYNAMO_MODE="default",
        ACCELERATE_DYNAMO_USE_FULLGRAPH="False",
        ACCELERATE_DYNAMO_USE_DYNAMIC="False",
        ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION="False",
    )
    config = resolved.config
    assert config.backend == "aot_eager"
    assert config.mode is None and resolved.sources["mode"] == "default"
    assert config.dynamic is None and resolved.sources["dynamic"] == "default"
    assert config.fullgraph is False
    assert config.regions.strategy == "whole"  # Accelerate compiles the whole model then


def test_dynamic_is_none_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve(monkeypatch, ACCELERATE_DYNAMO_BACKEND="eager").config.dynamic is None
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "false")
    assert resolve_config().config.dynamic is None
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "true")
    assert resolve_config().config.dynamic is True


def test_backend_no_turns_compilation_off_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "NO")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "true")
    with pytest.warns(
        UserWarning, match="compilation is off because env:ACCELERATE_DYNAMO_BACKEND"
    ):
        resolved = resolve_config()
    assert resolved.config.backend == "no" and not resolved.config.enabled
    # With dynamo off Accelerate ignores the other settings; so does torchkiln.
    assert resolved.config.regions.strategy == "auto"


def test_other_variables_without_a_backend_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    resolved = resolve(
        monkeypatch,
        ACCELERATE_DYNAMO_MODE="max-autotune",
        ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION="1",
    )
    assert resolved.config.mode is None
    assert resolved.config.regions.strategy == "auto"
    assert all(source == "default" for source in resolved.sources.values())


def test_torchkiln_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    resolved = resolve(
        monkeypatch,
        ACCELERATE_DYNAMO_BACKEND="INDUCTOR",
        ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION="true",
        TORCHKILN_BACKEND="eager",
        TORCHKILN_REGIONS_STRATEGY="paths",
        TORCHKILN_REGIONS_PATHS="model.layers.*",
    )
    assert resolved.config.backend == "eager"
    assert resolved.sources["backend"] == "env:TORCHKILN_BACKEND"
    assert resolved.config.regions.strategy == "paths"
    # The user chose the strategy: Accelerate's "rest compiled too" does not leak into it.
    assert resolved.config.regions.rest == "eager"
    assert resolved.sources["regions.rest"] == "default"


def test_keyword_arguments_and_torchkiln_yaml_win(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "true")
    (tmp_path / "torchkiln.yaml").write_text("fullgraph: false\n")
    resolved = resolve_config(backend="aot_eager")
    assert resolved.config.backend == "aot_eager"
    assert resolved.sources["backend"] == "argument"
    assert resolved.config.fullgraph is False
    assert resolved.sources["fullgraph"] == f"file:{tmp_path / 'torchkiln.yaml'}"


def test_bad_truth_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "eager")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "maybe")
    with pytest.raises(ConfigError) as error:
        resolve_config()
    assert str(error.value).splitlines()[1] == (
        "  $.fullgraph (from env:ACCELERATE_DYNAMO_USE_FULLGRAPH): 'maybe' is not a truth value; "
        "allowed: y, yes, t, true, on, 1 / n, no, f, false, off, 0"
    )


def test_unknown_backend_name_lists_accelerates_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "turbo")
    with pytest.raises(
        ConfigError,
        match=r"'turbo' is not an Accelerate dynamo backend; allowed "
        r"\(any case\): no, eager, aot_eager, inductor, ",
    ):
        resolve_config()


def test_backend_without_torchkiln_backend_fails_early(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "nvprims_nvfuser")
    with pytest.raises(ConfigError, match="nvFuser and the TorchScript backends were removed"):
        resolve_config()


def test_mapped_backend_that_cannot_run_here_fails_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "TENSORRT")
    with pytest.raises(ConfigError) as error:
        resolve_config()
    problem = error.value.problems[0]
    assert (problem.path, problem.source) == ("$.backend", PLUGIN)
    assert "'tensorrt' is not available here" in problem.message


# --- the config file ------------------------------------------------------------------------


ACCELERATE_FILE = """\
compute_environment: LOCAL_MACHINE
distributed_type: 'NO'
dynamo_config:
  dynamo_backend: AOT_EAGER
  dynamo_use_fullgraph: true
  dynamo_use_regional_compilation: true
mixed_precision: bf16
num_processes: 1
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_config_file_is_read_when_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = write(tmp_path / "accelerate.yaml", ACCELERATE_FILE)
    monkeypatch.setenv("TORCHKILN_ACCELERATE_CONFIG", str(path))
    config = resolve_config().config
    assert (config.backend, config.fullgraph, config.regions.strategy) == (
        "aot_eager",
        True,
        "repeated",
    )


def test_accelerates_default_file_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write(tmp_path / "hf_home" / "accelerate" / "default_config.yaml", ACCELERATE_FILE)
    assert resolve_config().config.backend == "inductor"  # never read behind the user's back
    monkeypatch.setenv("TORCHKILN_ACCELERATE_CONFIG", "default")
    assert resolve_config().config.backend == "aot_eager"


def test_environment_wins_over_the_file_field_by_field(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = write(tmp_path / "accelerate.yaml", ACCELERATE_FILE)
    monkeypatch.setenv("TORCHKILN_ACCELERATE_CONFIG", str(path))
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "eager")
    config = resolve_config().config
    assert config.backend == "eager"
    assert config.fullgraph is True  # still from the file


def test_older_top_level_backend_form(tmp_path: Path) -> None:
    path = write(tmp_path / "old.yaml", "distributed_type: MULTI_GPU\ndynamo_backend: eager\n")
    settings = read_yaml(path)
    assert settings.backend is DynamoBackend.EAGER
    assert settings.origins == {"backend": f"file:{path}"}
    assert to_overrides(settings) == {"backend": "eager"}
    no = write(tmp_path / "old_no.yaml", "dynamo_backend: 'NO'\n")
    assert to_overrides(read_yaml(no)) == {"backend": "no"}


def test_keys_without_the_dynamo_prefix(tmp_path: Path) -> None:
    """`accelerate launch` accepts `dynamo_config: {backend: ...}` too."""
    path = write(
        tmp_path / "short.yaml", "dynamo_config:\n  backend: inductor\n  mode: max-autotune\n"
    )
    assert to_overrides(read_yaml(path)) == {"backend": "inductor", "mode": "max-autotune"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "dynamo_config:\n  dynamo_backend: eager\n  dynamo_warp: true\n",
            "$.dynamo_config.dynamo_warp (from file:{path}): unknown dynamo_config key 'dynamo_warp'; "
            "allowed: dynamo_backend, dynamo_mode, dynamo_use_fullgraph, dynamo_use_dynamic, "
            "dynamo_use_regional_compilation",
        ),
        (
            "dynamo_config: inductor\n",
            "$.dynamo_config (from file:{path}): must be a mapping, not str",
        ),
        (
            "dynamo_backend: eager\ndynamo_config:\n  dynamo_backend: inductor\n",
            "$.dynamo_backend (from file:{path}): given both at the top level",
        ),
        ("- a list\n", "$ (from file:{path}): an Accelerate config file is a mapping, not list"),
        (
            "dynamo_config:\n  dynamo_use_dynamic: sometimes\n",
            "$.dynamo_config.dynamo_use_dynamic (from file:{path}): 'sometimes' is not a truth value",
        ),
    ],
)
def test_bad_config_files(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ConfigError) as error:
        read_yaml(path)
    assert message.format(path=path) in str(error.value)


def test_missing_config_file_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCHKILN_ACCELERATE_CONFIG", str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="cannot read the Accelerate config file"):
        resolve_config()


def test_empty_variables_count_as_unset() -> None:
    settings = read_env({"ACCELERATE_DYNAMO_BACKEND": "", "ACCELERATE_DYNAMO_MODE": "  "})
    assert settings.is_empty


def test_the_plugin_can_be_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchkiln.plugin_host.plugin_manager import PluginManager

    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "eager")
    manager = PluginManager(
        entry_points=False, env={"TORCHKILN_DISABLED_PLUGINS": "torchkiln.accelerate_config"}
    )
    resolved = resolve_config(plugins=manager)
    assert resolved.config.backend == "inductor" and resolved.sources["backend"] == "default"
    assert (
        resolve_config(plugins=PluginManager(entry_points=False, env={})).config.backend == "eager"
    )
