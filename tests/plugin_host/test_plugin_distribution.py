"""Plugins from real installed distributions that declare a ``torchkiln`` entry point.

Three tiny distributions are built and pip-installed (``--target``, never into the main
environment) once per session:

- ``tinyplug-dist 0.3.1``, entry point ``tinyplug``: backend ``tinyback``, whose compiled
  function counts its calls;
- ``brokenplug-dist 1.2.0``, entry point ``brokenplug``: its module raises on import;
- ``typoplug-dist 0.0.1``, entry point ``typoplug``: implements ``compile_regoin`` (a typo).

The CLI runs in a subprocess with ``PYTHONPATH`` pointing at them; the environment controls
are exercised in-process with the site directory on ``sys.path`` and the variables set in
``os.environ``, which is what ``torchkiln.PluginManager()`` reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from stack_model import Stack

import torchkiln
from torchkiln import PluginError

DISTRIBUTIONS = {
    "tinyplug": (
        "tinyplug-dist",
        "0.3.1",
        '''
        """A third-party torchkiln plugin: backend ``tinyback``."""
        from torchkiln import hookimpl
        from torchkiln.plugin import BackendSpec

        CALLS = []

        @hookimpl
        def declare_backends():
            return [BackendSpec("tinyback", "counts calls, runs eagerly", modes=())]

        @hookimpl
        def compile_region(fn, group):
            def compiled(module, *args, **kwargs):
                CALLS.append(group.name)
                return fn(module, *args, **kwargs)

            return compiled
        ''',
    ),
    "brokenplug": (
        "brokenplug-dist",
        "1.2.0",
        'raise RuntimeError("brokenplug cannot find its SDK")\n',
    ),
    "typoplug": (
        "typoplug-dist",
        "0.0.1",
        """
        from torchkiln import hookimpl

        @hookimpl
        def compile_regoin(fn, group, config, backend):
            return None
        """,
    ),
}
BROKEN_WARNING = (
    "torchkiln plugin 'brokenplug' = 'brokenplug' (from brokenplug-dist 1.2.0) failed to load "
    "and was skipped: RuntimeError: brokenplug cannot find its SDK"
)
TYPO_ERROR = (
    "PluginError: plugin 'typoplug' implements unknown hook 'compile_regoin' (did you mean "
    "'compile_region'?); torchkiln hooks: compile_region, declare_backends, declare_distributed, "
    "declare_layer_caches, declare_selectors, prepare_group, resolve_compile_config, "
    "select_regions, wrap_distributed"
)


def write_distribution(root: Path, module: str, dist: str, version: str, source: str) -> Path:
    project = root / dist
    project.mkdir()
    (project / f"{module}.py").write_text(textwrap.dedent(source).lstrip(), encoding="utf-8")
    (project / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{dist}"
            version = "{version}"

            [project.entry-points.torchkiln]
            {module} = "{module}"

            [tool.setuptools]
            py-modules = ["{module}"]
            """
        ),
        encoding="utf-8",
    )
    return project


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the three distributions, installed by pip (once per session)."""
    pytest.importorskip("setuptools", reason="building the test distributions needs setuptools")
    root = tmp_path_factory.mktemp("plugin-dists")
    projects = [write_distribution(root, module, *spec) for module, spec in DISTRIBUTIONS.items()]
    site = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "--target", str(site), *map(str, projects)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return site


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHKILN_", "ACCELERATE_"))}
    env.update(extra)
    return env


def run_cli(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchkiln", *args],
        env=clean_env(PYTHONPATH=str(site), **env),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


# --- the CLI, in a subprocess ---------------------------------------------------------------------


def test_plugins_json_lists_the_installed_plugin_and_skips_broken_ones(plugin_site: Path) -> None:
    result = run_cli(plugin_site, "plugins", "--json")
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)

    plugins = {p["name"]: p for p in listing["plugins"]}
    assert plugins["tinyplug"] == {
        "name": "tinyplug",
        "kind": "entry-point",
        "hooks": ["compile_region", "declare_backends"],
        "distribution": "tinyplug-dist",
        "version": "0.3.1",
        "target": "tinyplug",
    }
    assert {"torchkiln.backends", "torchkiln.selectors", "torchkiln.single_process"} <= set(plugins)
    assert all(
        plugins[name]["kind"] == "builtin" for name in plugins if name.startswith("torchkiln.")
    )
    assert "brokenplug" not in plugins and "typoplug" not in plugins

    backends = {b["name"]: b for b in listing["backends"]}
    assert backends["tinyback"]["plugin"] == "tinyplug"
    assert backends["tinyback"]["available"] is True
    assert backends["tinyback"]["description"] == "counts calls, runs eagerly"
    assert backends["eager"]["plugin"] == "torchkiln.backends"

    failed = {f["name"]: f for f in listing["failed"]}
    assert failed["brokenplug"] == {
        "name": "brokenplug",
        "target": "brokenplug",
        "distribution": "brokenplug-dist",
        "version": "1.2.0",
        "error": "RuntimeError: brokenplug cannot find its SDK",
        "hook": None,  # it failed to load (a failing declaration hook would be named here)
    }
    assert failed["typoplug"]["distribution"] == "typoplug-dist"
    assert failed["typoplug"]["error"] == TYPO_ERROR
    # Each failure is also a warning on stderr naming entry point, distribution, version, error.
    assert BROKEN_WARNING in result.stderr
    assert "'typoplug' = 'typoplug' (from typoplug-dist 0.0.1) failed to load" in result.stderr


def test_strict_plugins_turns_a_broken_plugin_into_an_error(plugin_site: Path) -> None:
    result = run_cli(
        plugin_site,
        "plugins",
        "--json",
        TORCHKILN_STRICT_PLUGINS="1",
        TORCHKILN_PLUGINS="brokenplug",
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines()[-1] == (
        "torchkiln: error: torchkiln plugin 'brokenplug' = 'brokenplug' (from brokenplug-dist "
        "1.2.0) failed to load and was not loaded: RuntimeError: brokenplug cannot find its SDK "
        "(TORCHKILN_STRICT_PLUGINS=1)"
    )


def test_trace_plugins_prints_hook_calls_to_stderr(plugin_site: Path) -> None:
    result = run_cli(
        plugin_site, "plugins", "--json", TORCHKILN_TRACE_PLUGINS="1", TORCHKILN_PLUGINS="tinyplug"
    )
    assert result.returncode == 0, result.stderr
    json.loads(result.stdout)  # the trace never reaches stdout
    lines = result.stderr.splitlines()
    assert "torchkiln: hook declare_backends() -> plugin tinyplug" in lines
    returned = [
        line
        for line in lines
        if line.startswith("torchkiln: hook declare_backends [tinyplug] returned ")
    ]
    assert len(returned) == 1 and "BackendSpec(name='tinyback'" in returned[0]
    assert "torchkiln: hook declare_selectors() -> plugin torchkiln.selectors" in lines


# --- environment controls, in-process ----------------------------------------------------------------


@pytest.fixture
def on_path(plugin_site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The installed distributions importable in this process, forgotten afterwards."""
    monkeypatch.syspath_prepend(str(plugin_site))
    yield plugin_site
    for module in DISTRIBUTIONS:
        sys.modules.pop(module, None)


def external_from(pm: torchkiln.PluginManager) -> set[str]:
    """The external plugins of this test's distributions that the manager loaded."""
    pm.ensure_loaded()
    return set(pm.external) & set(DISTRIBUTIONS)


def failed_from(pm: torchkiln.PluginManager) -> dict[str, Any]:
    return {f.name: f for f in pm.failed if f.name in DISTRIBUTIONS}


def test_by_default_every_entry_point_loads_and_failures_warn(on_path: Path) -> None:
    with pytest.warns(RuntimeWarning) as caught:
        pm = torchkiln.PluginManager()
        loaded = external_from(pm)
    assert loaded == {"tinyplug"}
    assert set(failed_from(pm)) == {"brokenplug", "typoplug"}
    messages = [str(w.message) for w in caught]
    assert BROKEN_WARNING in messages
    assert pm.get_plugin("typoplug") is None  # registered, failed validation, unregistered
    assert pm.backends()["tinyback"].plugin == "tinyplug"


def test_disable_plugin_autoload(
    on_path: Path, monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder
) -> None:
    monkeypatch.setenv("TORCHKILN_DISABLE_PLUGIN_AUTOLOAD", "1")
    pm = torchkiln.PluginManager()
    assert pm.ensure_loaded().external == {}
    assert pm.failed == []
    assert "tinyback" not in pm.backends()
    assert "torchkiln.backends" in dict(pm.list_name_plugin())  # built-ins stay
    assert [str(w.message) for w in recwarn] == []


def test_disable_plugin_autoload_still_allows_an_explicit_load(
    on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHKILN_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("TORCHKILN_PLUGINS", "tinyplug")
    pm = torchkiln.PluginManager()
    pm.load_external()
    assert external_from(pm) == {"tinyplug"}


def test_torchkiln_plugins_loads_only_the_named_entry_points(
    on_path: Path, monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder
) -> None:
    monkeypatch.setenv("TORCHKILN_PLUGINS", "tinyplug")
    pm = torchkiln.PluginManager()
    assert set(pm.ensure_loaded().external) == {"tinyplug"}
    assert pm.failed == []  # brokenplug and typoplug were never imported
    assert "brokenplug" not in sys.modules
    assert [str(w.message) for w in recwarn] == []


def test_torchkiln_plugins_takes_entry_point_names_not_distribution_names(
    on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHKILN_PLUGINS", "tinyplug-dist")
    assert torchkiln.PluginManager().ensure_loaded().external == {}


def test_disabled_plugins_blocks_external_ones(
    on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHKILN_DISABLED_PLUGINS", "tinyplug, brokenplug")
    with pytest.warns(RuntimeWarning, match="'typoplug'") as caught:
        pm = torchkiln.PluginManager()
        assert external_from(pm) == set()
    assert set(failed_from(pm)) == {"typoplug"}
    assert not any("brokenplug" in str(w.message) for w in caught)
    assert pm.is_blocked("tinyplug")
    assert "tinyback" not in pm.backends()


def test_disabled_plugins_blocks_a_builtin_by_its_registered_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHKILN_DISABLED_PLUGINS", "torchkiln.tensorrt")
    monkeypatch.setenv("TORCHKILN_DISABLE_PLUGIN_AUTOLOAD", "1")
    pm = torchkiln.PluginManager()
    names = {info.name for info in pm.plugin_infos()}
    assert "torchkiln.tensorrt" not in names
    assert {"torchkiln.backends", "torchkiln.selectors", "torchkiln.tvm"} <= names
    assert "tensorrt" not in pm.backends(include_torch=False)
    assert "tensorrt" in torchkiln.PluginManager(entry_points=False, env={}).backends(
        include_torch=False
    )


def test_strict_plugins_raises_in_process(on_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHKILN_STRICT_PLUGINS", "1")
    monkeypatch.setenv("TORCHKILN_PLUGINS", "typoplug")
    pm = torchkiln.PluginManager()
    with pytest.raises(PluginError) as raised:
        pm.backends()
    assert str(raised.value) == (
        "torchkiln plugin 'typoplug' = 'typoplug' (from typoplug-dist 0.0.1) failed to load and "
        f"was not loaded: {TYPO_ERROR} (TORCHKILN_STRICT_PLUGINS=1)"
    )
    assert pm.get_plugin("typoplug") is None


def test_entry_points_load_lazily_and_once(on_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHKILN_PLUGINS", "tinyplug")
    pm = torchkiln.PluginManager()
    assert pm.get_plugin("tinyplug") is None  # nothing loaded at construction
    pm.ensure_loaded()
    plugin = pm.get_plugin("tinyplug")
    assert plugin is not None
    pm.ensure_loaded()
    pm.load_external()  # already registered: not loaded twice
    assert [name for name, _ in pm.list_name_plugin()].count("tinyplug") == 1
    assert pm.get_plugin("tinyplug") is plugin


def test_the_installed_backend_compiles_regions(
    on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHKILN_PLUGINS", "tinyplug")
    pm = torchkiln.PluginManager()
    model = Stack(depth=3)
    x = torch.randn(2, 8)
    expected = model(x)
    torchkiln.compile(model, plugins=pm, backend="TinyBack")
    torch.testing.assert_close(model(x), expected)
    calls = sys.modules["tinyplug"].CALLS
    assert calls == ["Block", "Block", "Block"]


def test_trace_plugins_in_process_shows_pipeline_hooks(
    on_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCHKILN_PLUGINS", "tinyplug")
    monkeypatch.setenv("TORCHKILN_TRACE_PLUGINS", "1")
    pm = torchkiln.PluginManager()
    torchkiln.compile(Stack(depth=2), plugins=pm, backend="tinyback", progress="off")
    err = capsys.readouterr().err
    for hook in ("select_regions", "wrap_distributed", "compile_region", "resolve_compile_config"):
        assert f"torchkiln: hook {hook}(" in err, hook
    compile_line = next(
        line for line in err.splitlines() if line.startswith("torchkiln: hook compile_region(")
    )
    assert "backend='tinyback'" in compile_line
    # Only the plugin that declared the backend is called.
    assert compile_line.split(" -> ")[1] == "plugin tinyplug"


# --- precedence, names, plugin controls --------------------------------------------------------------


class TinybackOverride:
    """Declares ``tinyback`` too, compiled by plain aot_eager."""

    @torchkiln.hookimpl
    def declare_backends(self) -> list[Any]:
        from torchkiln.plugin import BackendSpec

        return [BackendSpec("tinyback", "the embedding framework's own")]

    @torchkiln.hookimpl
    def compile_region(self, fn: Any) -> Any:
        return fn


@pytest.mark.parametrize("register_first", [True, False], ids=["before-loading", "after-loading"])
def test_a_registered_plugin_wins_over_entry_points_whenever_it_registers(
    on_path: Path, register_first: bool
) -> None:
    pm = torchkiln.PluginManager(env={"TORCHKILN_PLUGINS": "tinyplug"})
    if not register_first:
        pm.ensure_loaded()
    with pytest.warns(RuntimeWarning, match="'tinyback' is declared by both"):
        pm.register(TinybackOverride(), name="framework")
        declared = pm.backends()["tinyback"]
    assert declared.plugin == "framework"
    names = [name for name, _ in pm.list_name_plugin()]
    assert names.index("tinyplug") < names.index("framework")


def test_plugin_controls_match_case_insensitively(on_path: Path) -> None:
    pm = torchkiln.PluginManager(
        env={"TORCHKILN_PLUGINS": "TinyPlug", "TORCHKILN_DISABLED_PLUGINS": "TorchKiln.TensorRT"}
    )
    assert external_from(pm) == {"tinyplug"}
    assert "tensorrt" not in pm.backends(include_torch=False)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "TORCHKILN_DISABLED_PLUGINS",
            "tensorrt",
            "TORCHKILN_DISABLED_PLUGINS: 'tensorrt' matches no plugin (did you mean "
            "'torchkiln.tensorrt'?); names are matched case-insensitively",
        ),
        (
            "TORCHKILN_DISABLED_PLUGINS",
            "acm",
            "TORCHKILN_DISABLED_PLUGINS: 'acm' matches no plugin; names are matched "
            "case-insensitively; known: torchkiln.backends, torchkiln.selectors",
        ),
        (
            "TORCHKILN_PLUGINS",
            "acm",
            "TORCHKILN_PLUGINS: 'acm' matches no installed plugin (entry-point name); names are "
            "matched case-insensitively; known: brokenplug, tinyplug, typoplug",
        ),
        (
            "TORCHKILN_PLUGINS",
            "tinyplg",
            "TORCHKILN_PLUGINS: 'tinyplg' matches no installed plugin (entry-point name) (did you "
            "mean 'tinyplug'?); names are matched case-insensitively",
        ),
    ],
)
def test_unknown_names_in_plugin_controls_warn_with_the_closest_name(
    on_path: Path, variable: str, value: str, message: str
) -> None:
    pm = torchkiln.PluginManager(env={variable: value})
    with pytest.warns(RuntimeWarning) as caught:
        pm.ensure_loaded()
    assert any(str(w.message).startswith(message) for w in caught), [str(w.message) for w in caught]


def test_an_unknown_backend_error_names_disabled_and_failed_plugins(on_path: Path) -> None:
    with pytest.warns(RuntimeWarning, match="typoplug"):
        pm = torchkiln.PluginManager(env={"TORCHKILN_DISABLED_PLUGINS": "tinyplug"})
        with pytest.raises(torchkiln.ConfigError) as raised:
            torchkiln.plan(Stack(), backend="tinyback", plugins=pm)
    assert (
        "(plugins disabled by TORCHKILN_DISABLED_PLUGINS: tinyplug; plugins that failed to "
        "load: brokenplug, typoplug)" in str(raised.value)
    )
