"""Malformed configuration from YAML, the environment and keyword arguments.

Every case asserts that the ``ConfigError`` names the field path (``$.distributed.strategy``)
and where the value came from (the file, the environment variable, or ``argument``), the bad
value, and what is allowed.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import attrs
import pytest

import torchkiln
from torchkiln import ConfigError, hookimpl
from torchkiln.engine.resolve import resolve_config
from torchkiln.errors import ConfigProblem
from torchkiln.plugin import BackendSpec

BOOLEANS = "allowed: 1/true/yes/on/0/false/no/off"
TOP_LEVEL = (
    "allowed: backend, mode, fullgraph, dynamic, options, disable, regions, distributed, tiered, "
    "job, on_region_error, store, cache_dir, remote_cache, artifacts, artifacts_strict, progress, report"
)
INDUCTOR_MODES = "allowed: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs"


class Restricted:
    """Backend ``restricted`` takes only the options ``alpha`` and ``beta``, and no mode."""

    @hookimpl
    def declare_backends(self) -> list[BackendSpec]:
        return [BackendSpec("restricted", modes=(), options=("alpha", "beta"))]

    @hookimpl
    def compile_region(self, fn: Any) -> Any:
        return fn


@pytest.fixture
def plugins() -> torchkiln.PluginManager:
    manager = torchkiln.PluginManager(entry_points=False, env={})
    manager.register(Restricted(), name="restricted-vendor")
    return manager


@attrs.frozen
class Case:
    id: str
    kind: str  # "yaml", "env" or "kwargs"
    given: Any  # YAML text, env mapping, or keyword arguments
    path: str
    fragments: tuple[str, ...]
    """Substrings of the problem's message: the bad value and what is allowed."""
    env_name: str | None = None
    """The variable the bad value came from (env cases)."""


CASES = [
    # --- YAML ------------------------------------------------------------------------------------
    Case(
        "yaml-unknown-top-level",
        "yaml",
        "bakend: eager\n",
        "$.bakend",
        ("unknown field 'bakend'", "(did you mean 'backend'?)", TOP_LEVEL),
    ),
    Case(
        "yaml-unknown-nested",
        "yaml",
        "regions:\n  stratgy: whole\n",
        "$.regions.stratgy",
        (
            "unknown field 'stratgy'",
            "(did you mean 'strategy'?)",
            "allowed: strategy, classes, paths, exclude, rest, min_repeats, options",
        ),
    ),
    Case(
        "yaml-unknown-deeply-nested",
        "yaml",
        "distributed:\n  ddp:\n    find_unused: true\n",
        "$.distributed.ddp.find_unused",
        (
            "unknown field 'find_unused'",
            "did you mean 'find_unused_parameters'?",
            "allowed: find_unused_parameters, bucket_cap_mb, broadcast_buffers",
        ),
    ),
    Case(
        "yaml-bool-as-string",
        "yaml",
        "fullgraph: maybe\n",
        "$.fullgraph",
        ("expected bool", "(got 'maybe')"),
    ),
    Case(
        "yaml-int-as-string",
        "yaml",
        "regions:\n  min_repeats: two\n",
        "$.regions.min_repeats",
        ("expected int", "(got 'two')"),
    ),
    Case(
        "yaml-dtype-name",
        "yaml",
        "distributed:\n  fsdp2:\n    mixed_precision:\n      reduce_dtype: int8\n",
        "$.distributed.fsdp2.mixed_precision.reduce_dtype",
        ("'int8' is not a floating-point dtype name", "allowed: bfloat16, float16, float32"),
    ),
    Case(
        "yaml-replicate-degree-zero",
        "yaml",
        "distributed:\n  fsdp2:\n    replicate_degree: 0\n",
        "$.distributed.fsdp2.replicate_degree",
        ("0 must be at least 1",),
    ),
    Case(
        "yaml-options-list",
        "yaml",
        "options: [1, 2]\n",
        "$.options",
        ("expected dict", "(got [1, 2])"),
    ),
    Case(
        "yaml-classes-not-strings",
        "yaml",
        "regions:\n  classes: [1, 2]\n",
        "$.regions.classes",
        ("expected a list of strings", "(got [1, 2])"),
    ),
    Case(
        "yaml-dynamic-string",
        "yaml",
        "dynamic: sometimes\n",
        "$.dynamic",
        ("expected bool | None", "(got 'sometimes')"),
    ),
    Case(
        "yaml-unquoted-off",
        "yaml",
        "progress: off\n",
        "$.progress",
        ("expected str", "got False", "quote the value: 'off'"),
    ),
    Case(
        "yaml-unknown-backend",
        "yaml",
        "backend: bogus\n",
        "$.backend",
        (
            "'bogus' is not a registered backend",
            "registered by plugins: aot_eager, cudagraphs, eager,",
            "inductor",
            "restricted",
            "known to torch: aot_eager_decomp_partition",
        ),
    ),
    Case(
        "yaml-backend-typo",
        "yaml",
        "backend: inductr\n",
        "$.backend",
        ("'inductr' is not a registered backend (did you mean 'inductor'?)",),
    ),
    Case(
        "yaml-mode-the-backend-does-not-take",
        "yaml",
        "backend: eager\nmode: max-autotune\n",
        "$.mode",
        (
            "'max-autotune' is not a mode backend 'eager' accepts",
            "allowed: none (leave mode unset)",
        ),
    ),
    Case(
        "yaml-unknown-inductor-mode",
        "yaml",
        "mode: turbo\n",
        "$.mode",
        ("'turbo' is not a mode backend 'inductor' accepts", INDUCTOR_MODES),
    ),
    Case(
        "yaml-option-key-the-backend-restricts",
        "yaml",
        "backend: restricted\noptions:\n  gamma: 1\n",
        "$.options.gamma",
        ("backend 'restricted' does not accept option 'gamma'", "allowed: alpha, beta"),
    ),
    Case(
        "yaml-unknown-distributed-strategy",
        "yaml",
        "distributed:\n  strategy: mpi\n",
        "$.distributed.strategy",
        ("'mpi' is not a declared distributed strategy", "allowed: ddp, deepspeed, fsdp2, none"),
    ),
    Case(
        "yaml-unknown-distributed-shorthand",
        "yaml",
        "distributed: horovod\n",
        "$.distributed.strategy",
        (
            "'horovod' is not a declared distributed strategy",
            "allowed: ddp, deepspeed, fsdp2, none",
        ),
    ),
    Case(
        "yaml-unknown-region-strategy",
        "yaml",
        "regions:\n  strategy: blocks\n",
        "$.regions.strategy",
        (
            "'blocks' is not a declared selector",
            "allowed: auto, classes, hierarchical, paths, repeated, whole",
        ),
    ),
    Case(
        "yaml-bad-on-region-error",
        "yaml",
        "on_region_error: ignore\n",
        "$.on_region_error",
        ("'ignore' is not a region error policy", "allowed: eager, raise"),
    ),
    Case(
        "yaml-bad-rest",
        "yaml",
        "regions:\n  rest: everything\n",
        "$.regions.rest",
        ("'everything' is not a rest policy", "allowed: eager, leaves"),
    ),
    Case(
        "yaml-bad-progress",
        "yaml",
        "progress: loud\n",
        "$.progress",
        ("'loud' is not a progress setting", "allowed: auto, off, on"),
    ),
    Case(
        "yaml-min-repeats-zero",
        "yaml",
        "regions:\n  min_repeats: 0\n",
        "$.regions.min_repeats",
        ("0 must be at least 1",),
    ),
    Case(
        "yaml-regions-not-a-mapping",
        "yaml",
        "regions: 5\n",
        "$.regions",
        (
            "expected a mapping with the fields strategy, classes, paths, exclude, rest, min_repeats, options or a strategy name",
            "(got 5)",
        ),
    ),
    Case(
        "yaml-distributed-list",
        "yaml",
        "distributed: [ddp]\n",
        "$.distributed",
        (
            "expected a mapping with the fields strategy, ddp, fsdp2, deepspeed, options",
            "(got ['ddp'])",
        ),
    ),
    Case(
        "yaml-deepspeed-config-number",
        "yaml",
        "distributed:\n  deepspeed:\n    config: 3\n",
        "$.distributed.deepspeed.config",
        ("expected a mapping or a path", "(got 3)"),
    ),
    Case(
        "yaml-cache-dir-number",
        "yaml",
        "cache_dir: 5\n",
        "$.cache_dir",
        ("expected str | None", "(got 5)"),
    ),
    # --- environment -----------------------------------------------------------------------------
    Case(
        "env-boolean",
        "env",
        {"TORCHKILN_FULLGRAPH": "maybe"},
        "$.fullgraph",
        ("'maybe' is not a boolean", BOOLEANS),
        "TORCHKILN_FULLGRAPH",
    ),
    Case(
        "env-boolean-2",
        "env",
        {"TORCHKILN_DISTRIBUTED_DDP_STATIC_GRAPH": "2"},
        "$.distributed.ddp.static_graph",
        ("'2' is not a boolean", BOOLEANS),
        "TORCHKILN_DISTRIBUTED_DDP_STATIC_GRAPH",
    ),
    Case(
        "env-optional-boolean",
        "env",
        {"TORCHKILN_DYNAMIC": "sometimes"},
        "$.dynamic",
        ("'sometimes' is not a boolean", BOOLEANS + "/none"),
        "TORCHKILN_DYNAMIC",
    ),
    Case(
        "env-dtype-name",
        "env",
        {"TORCHKILN_DISTRIBUTED_FSDP2_MIXED_PRECISION_PARAM_DTYPE": "bf16"},
        "$.distributed.fsdp2.mixed_precision.param_dtype",
        (
            "'bf16' is not a floating-point dtype name (did you mean 'bfloat16'?)",
            "allowed: bfloat16, float16, float32, float64",
        ),
        "TORCHKILN_DISTRIBUTED_FSDP2_MIXED_PRECISION_PARAM_DTYPE",
    ),
    Case(
        "env-int",
        "env",
        {"TORCHKILN_REGIONS_MIN_REPEATS": "two"},
        "$.regions.min_repeats",
        ("'two' is not a whole number",),
        "TORCHKILN_REGIONS_MIN_REPEATS",
    ),
    Case(
        "env-float",
        "env",
        {"TORCHKILN_DISTRIBUTED_DDP_BUCKET_CAP_MB": "lots"},
        "$.distributed.ddp.bucket_cap_mb",
        ("'lots' is not a number",),
        "TORCHKILN_DISTRIBUTED_DDP_BUCKET_CAP_MB",
    ),
    Case(
        "env-json-syntax",
        "env",
        {"TORCHKILN_OPTIONS": "{max_autotune: true}"},
        "$.options",
        ("'{max_autotune: true}' is not a JSON object", "Expecting property name"),
        "TORCHKILN_OPTIONS",
    ),
    Case(
        "env-json-not-object",
        "env",
        {"TORCHKILN_DISTRIBUTED_OPTIONS": "[1, 2]"},
        "$.distributed.options",
        ("'[1, 2]' is not a JSON object",),
        "TORCHKILN_DISTRIBUTED_OPTIONS",
    ),
    Case(
        "env-unknown-backend",
        "env",
        {"TORCHKILN_BACKEND": "bogus"},
        "$.backend",
        (
            "'bogus' is not a registered backend",
            "registered by plugins: aot_eager",
            "known to torch:",
        ),
        "TORCHKILN_BACKEND",
    ),
    Case(
        "env-regions-shorthand",
        "env",
        {"TORCHKILN_REGIONS": "blocks"},
        "$.regions.strategy",
        ("'blocks' is not a declared selector", "allowed: auto, classes"),
        "TORCHKILN_REGIONS",
    ),
    Case(
        "env-distributed-strategy",
        "env",
        {"TORCHKILN_DISTRIBUTED_STRATEGY": "mpi"},
        "$.distributed.strategy",
        ("'mpi' is not a declared distributed strategy", "allowed: ddp, deepspeed, fsdp2, none"),
        "TORCHKILN_DISTRIBUTED_STRATEGY",
    ),
    Case(
        "env-min-repeats-zero",
        "env",
        {"TORCHKILN_REGIONS_MIN_REPEATS": "0"},
        "$.regions.min_repeats",
        ("0 must be at least 1",),
        "TORCHKILN_REGIONS_MIN_REPEATS",
    ),
    Case(
        "env-on-region-error",
        "env",
        {"TORCHKILN_ON_REGION_ERROR": "retry"},
        "$.on_region_error",
        ("'retry' is not a region error policy", "allowed: eager, raise"),
        "TORCHKILN_ON_REGION_ERROR",
    ),
    Case(
        "env-mode",
        "env",
        {"TORCHKILN_BACKEND": "aot_eager", "TORCHKILN_MODE": "max-autotune"},
        "$.mode",
        (
            "'max-autotune' is not a mode backend 'aot_eager' accepts",
            "allowed: none (leave mode unset)",
        ),
        "TORCHKILN_MODE",
    ),
    # --- keyword arguments -----------------------------------------------------------------------
    Case(
        "kwargs-unknown",
        "kwargs",
        {"bakend": "eager"},
        "$.bakend",
        ("unknown field 'bakend'", "(did you mean 'backend'?)", TOP_LEVEL),
    ),
    Case(
        "kwargs-unknown-nested",
        "kwargs",
        {"distributed": {"fsdp2": {"reshard_after_foward": False}}},
        "$.distributed.fsdp2.reshard_after_foward",
        ("unknown field 'reshard_after_foward'", "did you mean 'reshard_after_forward'?"),
    ),
    Case(
        "kwargs-bool-as-string",
        "kwargs",
        {"fullgraph": "yes"},
        "$.fullgraph",
        ("expected bool", "(got 'yes')"),
    ),
    Case("kwargs-bool-as-int", "kwargs", {"report": 1}, "$.report", ("expected bool", "(got 1)")),
    Case(
        "kwargs-backend-not-a-string",
        "kwargs",
        {"backend": 3},
        "$.backend",
        ("expected str", "(got 3)"),
    ),
    Case(
        "kwargs-mode",
        "kwargs",
        {"backend": "eager", "mode": "max-autotune"},
        "$.mode",
        (
            "'max-autotune' is not a mode backend 'eager' accepts",
            "allowed: none (leave mode unset)",
        ),
    ),
    Case(
        "kwargs-option-key",
        "kwargs",
        {"backend": "Restricted", "options": {"alpha": 1, "delta": 2}},
        "$.options.delta",
        ("backend 'restricted' does not accept option 'delta'", "allowed: alpha, beta"),
    ),
    Case(
        "kwargs-classes-without-classes",
        "kwargs",
        {"regions": "classes"},
        "$.regions.classes",
        ("strategy 'classes' needs at least one class-name glob in regions.classes",),
    ),
    Case(
        "kwargs-paths-without-paths",
        "kwargs",
        {"regions": {"strategy": "paths"}},
        "$.regions.paths",
        ("strategy 'paths' needs at least one module-path glob in regions.paths",),
    ),
    Case(
        "kwargs-distributed-shorthand",
        "kwargs",
        {"distributed": "mpi"},
        "$.distributed.strategy",
        ("'mpi' is not a declared distributed strategy", "allowed: ddp, deepspeed, fsdp2, none"),
    ),
    Case(
        "kwargs-rest",
        "kwargs",
        {"regions": {"rest": "all"}},
        "$.regions.rest",
        ("'all' is not a rest policy", "allowed: eager, leaves"),
    ),
    Case(
        "kwargs-progress",
        "kwargs",
        {"progress": "verbose"},
        "$.progress",
        ("'verbose' is not a progress setting", "allowed: auto, off, on"),
    ),
]


def test_there_are_at_least_thirty_cases_from_each_source_kind() -> None:
    assert len(CASES) >= 30
    assert {case.kind for case in CASES} == {"yaml", "env", "kwargs"}
    assert len({case.id for case in CASES}) == len(CASES)


def resolve_case(
    case: Case, plugins: torchkiln.PluginManager, tmp_path: Path
) -> tuple[ConfigError, str]:
    """Resolve the case's configuration; return the error and the source it must name."""
    config_file, env, kwargs = None, {}, {}
    if case.kind == "yaml":
        config_file = tmp_path / "torchkiln-case.yaml"
        config_file.write_text(case.given, encoding="utf-8")
        source = f"file:{config_file}"
    elif case.kind == "env":
        env, source = case.given, f"env:{case.env_name}"
    else:
        kwargs, source = case.given, "argument"
    with pytest.raises(ConfigError) as raised:
        resolve_config(config_file, plugins=plugins, env=env, **kwargs)
    return raised.value, source


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_malformed_configuration(
    case: Case, plugins: torchkiln.PluginManager, tmp_path: Path
) -> None:
    error, source = resolve_case(case, plugins, tmp_path)
    [problem] = error.problems
    assert problem.path == case.path
    for fragment in case.fragments:
        assert fragment in problem.message, f"{fragment!r} missing from {problem.message!r}"
    if case.id in ("kwargs-classes-without-classes", "kwargs-paths-without-paths"):
        # The missing field was never set: the problem names the strategy that needs it.
        assert problem.source == "default"
        assert str(error).endswith(f"\n  {case.path}: {problem.message}")
        return
    assert problem.source == source
    # The rendered error carries path, source and message on one line.
    assert str(error) == (
        f"invalid torchkiln configuration (1 problem):\n  {case.path} (from {source}): {problem.message}"
    )


# --- problems with the file itself --------------------------------------------------------------------


def single_problem(raised: pytest.ExceptionInfo[ConfigError]) -> ConfigProblem:
    [problem] = raised.value.problems
    return problem


def test_python_tags_are_rejected_and_nothing_runs(
    plugins: torchkiln.PluginManager, tmp_path: Path
) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.yaml"
    path.write_text(
        f'backend: !!python/object/apply:os.system ["touch {marker}"]\n', encoding="utf-8"
    )
    with pytest.raises(ConfigError) as raised:
        resolve_config(path, plugins=plugins, env={})
    problem = single_problem(raised)
    assert (problem.path, problem.source) == ("$.backend", f"file:{path}")
    assert problem.message.startswith(
        "the YAML tag 'tag:yaml.org,2002:python/object/apply:os.system' is not allowed"
    )
    assert problem.message.endswith("(line 1)")
    assert "torchkiln reads YAML with a safe loader" in problem.message
    assert not marker.exists()


def test_python_name_tag_is_rejected(plugins: torchkiln.PluginManager, tmp_path: Path) -> None:
    path = tmp_path / "name.yaml"
    path.write_text("options:\n  hook: !!python/name:os.getcwd\n", encoding="utf-8")
    with pytest.raises(
        ConfigError, match=r"\$\.options\.hook .*YAML tag .*python/name:os\.getcwd.* \(line 2\)"
    ):
        resolve_config(path, plugins=plugins, env={})


def test_a_yaml_list_is_rejected(plugins: torchkiln.PluginManager, tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- backend: eager\n- fullgraph: true\n", encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        resolve_config(path, plugins=plugins, env={})
    assert (
        str(single_problem(raised))
        == f"$ (from file:{path}): the top level must be a mapping of fields, got a list"
    )


def test_invalid_yaml_syntax_names_the_line(
    plugins: torchkiln.PluginManager, tmp_path: Path
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("backend: eager\nregions: [whole\n", encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        resolve_config(path, plugins=plugins, env={})
    problem = single_problem(raised)
    assert problem.message.startswith("not valid YAML: while parsing a flow sequence")
    assert "line 2, column 10" in problem.message


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_an_unreadable_file(plugins: torchkiln.PluginManager, tmp_path: Path, what: str) -> None:
    path = tmp_path / "nothing.yaml" if what == "missing" else tmp_path
    with pytest.raises(ConfigError) as raised:
        resolve_config(path, plugins=plugins, env={})
    reason = "No such file or directory" if what == "missing" else f"{str(path)!r} is a directory"
    assert str(single_problem(raised)) == f"$ (from file:{path}): cannot read config file: {reason}"


def test_torchkiln_config_naming_a_missing_file(
    plugins: torchkiln.PluginManager, tmp_path: Path
) -> None:
    path = tmp_path / "gone.yaml"
    with pytest.raises(ConfigError, match=f"from file:{path}.*No such file or directory"):
        resolve_config(plugins=plugins, env={"TORCHKILN_CONFIG": str(path)})


def test_an_empty_file_is_all_defaults(plugins: torchkiln.PluginManager, tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing set\n", encoding="utf-8")
    assert resolve_config(path, plugins=plugins, env={}).config == torchkiln.CompileConfig()


def test_a_config_argument_of_the_wrong_type(plugins: torchkiln.PluginManager) -> None:
    with pytest.raises(ConfigError) as raised:
        resolve_config(42, plugins=plugins, env={})  # type: ignore[arg-type]
    assert str(single_problem(raised)) == (
        "$ (from argument): config must be a CompileConfig, a mapping or the path of a YAML file, not int"
    )


# --- several problems at once -------------------------------------------------------------------------


def test_every_problem_from_every_source_is_listed_in_one_error(
    plugins: torchkiln.PluginManager, tmp_path: Path
) -> None:
    path = tmp_path / "many.yaml"
    path.write_text(
        textwrap.dedent(
            """
            bakend: eager
            fullgraph: maybe
            regions:
              min_repeats: 0
              stratgy: whole
            distributed: mpi
            """
        ),
        encoding="utf-8",
    )
    env = {"TORCHKILN_DYNAMIC": "sometimes", "TORCHKILN_ON_REGION_ERROR": "ignore"}

    with pytest.raises(ConfigError) as raised:
        resolve_config(path, plugins=plugins, env=env, backend="bogus", progress="loud")

    where = f"file:{path}"
    found = {(p.path, p.source) for p in raised.value.problems}
    assert found == {
        ("$.bakend", where),
        ("$.regions.stratgy", where),
        ("$.fullgraph", where),
        ("$.regions.min_repeats", where),
        ("$.distributed.strategy", where),
        ("$.dynamic", "env:TORCHKILN_DYNAMIC"),
        ("$.on_region_error", "env:TORCHKILN_ON_REGION_ERROR"),
        ("$.backend", "argument"),
        ("$.progress", "argument"),
    }
    text = str(raised.value)
    assert text.startswith("invalid torchkiln configuration (9 problems):\n")
    assert len(text.splitlines()) == 10


def test_a_field_with_a_type_error_is_reported_once(plugins: torchkiln.PluginManager) -> None:
    # classes has the wrong type; the 'classes needs globs' check must not pile on.
    with pytest.raises(ConfigError) as raised:
        resolve_config(plugins=plugins, env={}, regions={"strategy": "classes", "classes": [1]})
    assert [p.path for p in raised.value.problems] == ["$.regions.classes"]


def test_config_error_is_a_value_error_and_a_torchkiln_error() -> None:
    error = ConfigError("plain message")
    assert isinstance(error, ValueError) and isinstance(error, torchkiln.TorchkilnError)
    assert error.problems == (ConfigProblem("$", "plain message"),)
    assert str(error) == "invalid torchkiln configuration (1 problem):\n  $: plain message"


# --- the same errors from the command line ----------------------------------------------------------


def test_config_show_with_a_bad_env_backend_exits_non_zero_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchkiln.cli import commands as cli

    monkeypatch.setenv("TORCHKILN_BACKEND", "bogus")
    assert cli.main(["config", "show"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(
        "torchkiln: error: invalid torchkiln configuration (1 problem):\n"
        "  $.backend (from env:TORCHKILN_BACKEND): 'bogus' is not a registered backend; "
        "registered by plugins: aot_eager, cudagraphs, eager,"
    )
    assert "known to torch: aot_eager_decomp_partition" in err


def test_config_validate_prints_the_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchkiln.cli import commands as cli

    path = tmp_path / "bad.yaml"
    path.write_text("regions:\n  strategy: blocks\n", encoding="utf-8")
    assert cli.main(["config", "validate", str(path)]) == 2
    with pytest.raises(ConfigError) as raised:
        resolve_config(path)
    assert capsys.readouterr().err == f"torchkiln: error: {raised.value}\n"
    path.write_text("regions: whole\n", encoding="utf-8")
    assert cli.main(["config", "validate", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: valid\n"


@pytest.mark.parametrize("value", ["dynamo", "direct", "reduced"])
def test_the_removed_dispatch_field_is_refused_saying_what_to_do(
    plugins: torchkiln.PluginManager, value: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        resolve_config(None, plugins=plugins, dispatch=value)
    message = str(raised.value)
    assert "$.dispatch" in message and "'dispatch' was removed" in message
    assert "remove the setting" in message and "unknown field" not in message


def test_the_removed_dispatch_field_is_refused_in_a_file_naming_the_file(
    plugins: torchkiln.PluginManager, tmp_path: Path
) -> None:
    path = tmp_path / "torchkiln.yaml"
    path.write_text("dispatch: dynamo\n")
    with pytest.raises(ConfigError) as raised:
        resolve_config(str(path), plugins=plugins)
    assert f"$.dispatch (from file:{path})" in str(raised.value)
