"""Issue 25's vendor items (B1, B3-B7, F4, F8) and issue 23's W3, with plugins installed as pip
would leave them (a module and its ``.dist-info`` on the path, :mod:`plugin_site`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from plugin_site import write_plugin
from stack_model import Stack

import torchkiln
from torchkiln import ConfigError, PluginError, hookimpl
from torchkiln.plugin import BackendSpec, SelectorSpec, compile_with_torch, torch_backend

ACME = '''
    """Backends ``acme`` (many options) and ``acme-npu`` (unavailable here)."""
    from torchkiln import hookimpl
    from torchkiln.plugin import Availability, BackendSpec, compile_with_torch

    OPTIONS = tuple(f"acme_option_number_{i}" for i in range(40))

    @hookimpl
    def declare_backends():
        why = "acme_npu_sdk is not installed: pip install acme-npu-sdk " + "(see the docs) " * 12
        return [
            BackendSpec("acme", "Acme's graph compiler " * 8, options=OPTIONS),
            BackendSpec("acme-npu", "on Acme NPUs", probe=lambda: Availability.no(why)),
        ]

    @hookimpl
    def compile_region(fn, group, config, backend):
        return compile_with_torch(fn, config, backend="eager")
'''
ZETA = '''
    """Selector ``zeta`` with options, and backend ``eager`` taken over."""
    from torchkiln import hookimpl
    from torchkiln.plugin import BackendSpec, SelectorSpec, compile_with_torch

    @hookimpl
    def declare_selectors():
        return [SelectorSpec("zeta", "every block " * 20, options=("depth", "skip"))]

    @hookimpl
    def select_regions(model, config, selector):
        from torchkiln.plugin import select_with
        return select_with(model, config, "repeated")

    @hookimpl
    def declare_backends():
        return [BackendSpec("eager", "zeta's own eager")]

    @hookimpl
    def compile_region(fn, group, config, backend):
        return compile_with_torch(fn, config, backend="eager")
'''
FAULTY = """
    from torchkiln import hookimpl

    @hookimpl
    def declare_backends():
        raise RuntimeError("faulty cannot reach its license server")

    @hookimpl
    def compile_region(fn, group, config, backend):
        return fn
"""
WRONG_TYPE = """
    from torchkiln import hookimpl

    @hookimpl
    def declare_selectors():
        return "wrongsel"

    @hookimpl
    def select_regions(model, config, selector):
        return None
"""
HALF = """
    from torchkiln import hookimpl
    from torchkiln.plugin import BackendSpec

    @hookimpl
    def declare_backends():
        return [BackendSpec("half")]
"""


def _site(root: Path, **plugins: str) -> Path:
    for module, source in plugins.items():
        write_plugin(root, module, source)
    return root


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """acme and zeta, two working third-party plugins; faulty and wrongtype, two broken ones."""
    return _site(tmp_path / "site", acme=ACME, zeta=ZETA, faulty=FAULTY, wrongtype=WRONG_TYPE)


@pytest.fixture
def on_path(site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(site))
    yield site
    for module in ("acme", "zeta", "faulty", "wrongtype", "half", "alpha", "beta"):
        sys.modules.pop(module, None)


def _cli(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCHKILN_")}
    return subprocess.run(
        [sys.executable, "-m", "torchkiln", *args],
        env=clean | {"PYTHONPATH": str(site), "COLUMNS": "400", **env},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


# --- B1 and W3 through the command line -----------------------------------------------------------


def test_plugins_listing_fits_120_columns_and_quarantines_broken_declarations(site: Path) -> None:
    result = _cli(site, "plugins")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 120, max(lines, key=len)
    text = " ".join(result.stdout.split())  # wrapped lines joined
    # Every working plugin is listed with what it declares ...
    backends = lines[lines.index("backends:") :]
    acme = next(line for line in backends if line.startswith("  acme "))
    assert "acme_option_number_0" in acme and "(+" in acme and "more)" in acme
    assert any(line.startswith("  zeta ") and "depth, skip" in line for line in lines)
    assert any(line.startswith("  acme-npu ") and "  no  " in line for line in backends)
    # ... the broken ones as FAILED with the reason, the others unaffected (issue 23, W3).
    assert "FAILED faulty (faulty-dist 1.0): quarantined, its declare_backends() raised" in text
    assert "RuntimeError: faulty cannot reach its license server" in text
    assert "FAILED wrongtype (wrongtype-dist 1.0): quarantined, its declare_selectors() " in text
    assert "returned str 'wrongsel'; expected a list of torchkiln.plugin.SelectorSpec" in text
    assert any(line.startswith("  repeated ") for line in lines)
    assert any(line.startswith("  inductor ") for line in lines)


def test_a_quarantined_plugin_fails_the_listing_under_strict_plugins(site: Path) -> None:
    result = _cli(site, "plugins", TORCHKILN_STRICT_PLUGINS="1")
    assert result.returncode == 2
    assert "plugin 'faulty': declare_backends() raised RuntimeError" in result.stderr
    assert "(TORCHKILN_STRICT_PLUGINS=1)" in result.stderr


# --- W3 in-process ------------------------------------------------------------------------------


def test_one_broken_declaration_breaks_no_other_plugin(on_path: Path) -> None:
    pm = torchkiln.PluginManager(env={})
    model = Stack(depth=2)
    x = torch.randn(2, 8)
    expected = model(x)
    with pytest.warns(RuntimeWarning, match="'faulty'.* was quarantined"):
        torchkiln.compile(model, backend="acme", plugins=pm)
    torch.testing.assert_close(model(x), expected)
    assert {f.name: f.hook for f in pm.failed} == {
        "faulty": "declare_backends",
        "wrongtype": "declare_selectors",
    }
    assert pm.get_plugin("faulty") is None and "faulty" not in pm.external
    assert not pm.is_blocked("faulty") and "disabled" not in pm.missing_hint()
    pm.load_external()  # loading the entry points again does not bring it back
    assert pm.get_plugin("faulty") is None
    # Its names are unavailable with the reason.
    with pytest.raises(ConfigError) as raised:
        torchkiln.plan(Stack(), backend="faultyback", plugins=pm)
    message = str(raised.value)
    assert (
        "plugins quarantined, their names unavailable: plugin 'faulty' (its declare_backends("
        in (message)
    )
    assert (
        "'faulty' (its declare_backends() raised RuntimeError: faulty cannot reach its" in message
    )


# --- B3: warned once ---------------------------------------------------------------------------------


def test_a_declaration_without_its_hook_is_warned_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(_site(tmp_path / "half-site", half=HALF)))
    with pytest.warns(RuntimeWarning) as caught:
        torchkiln.PluginManager(env={"TORCHKILN_PLUGINS": "half"}).ensure_loaded()
    said = [str(w.message) for w in caught if "implements declare_backends" in str(w.message)]
    assert said == [
        "plugin 'half' implements declare_backends but not compile_region: the names it "
        "declares are refused when a configuration uses them; add a @hookimpl compile_region"
    ]
    sys.modules.pop("half", None)


# --- B4: every PluginError names the plugin and the hook -------------------------------------------


class SelectsNothing:
    @hookimpl
    def declare_selectors(self):
        return [SelectorSpec("nothing")]

    @hookimpl
    def select_regions(self, model, config, selector):
        return None


class BadCauses:
    @hookimpl
    def declare_backends(self):
        return [BackendSpec("badcauses", report_causes="not a tuple")]  # type: ignore[arg-type]

    @hookimpl
    def compile_region(self, fn, group, config, backend):
        return fn


class Typo:
    @hookimpl
    def compile_regoin(self, fn):
        return fn


class HalfSelector:
    @hookimpl
    def declare_selectors(self):
        return [SelectorSpec("half")]


def _fault(pm: torchkiln.PluginManager, case: str) -> None:
    if case == "select_regions returns None":
        pm.register(SelectsNothing(), name="vendor")
        torchkiln.compile(Stack(), backend="eager", regions="nothing", plugins=pm)
    elif case == "report_causes of the wrong type":
        pm.register(BadCauses(), name="vendor")
        torchkiln.compile(Stack(), backend="badcauses", plugins=pm)
    elif case == "unknown hook":
        pm.register(Typo(), name="vendor")
    elif case == "declared selector without select_regions, strict":
        strict = torchkiln.PluginManager(entry_points=False, env={"TORCHKILN_STRICT_PLUGINS": "1"})
        strict.register(HalfSelector(), name="vendor")
    elif case == "declared selector without select_regions, asked directly":
        with pytest.warns(RuntimeWarning, match="implements declare_selectors but not"):
            pm.register(HalfSelector(), name="vendor")
        pm.select_regions(Stack(), torchkiln.CompileConfig(), "half")


@pytest.mark.parametrize(
    ("case", "hook"),
    [
        ("select_regions returns None", "select_regions"),
        ("report_causes of the wrong type", "declare_backends"),
        ("unknown hook", "compile_regoin"),
        ("declared selector without select_regions, strict", "select_regions"),
        ("declared selector without select_regions, asked directly", "select_regions"),
    ],
)
def test_every_plugin_error_names_the_plugin_and_the_hook(
    pm: torchkiln.PluginManager, case: str, hook: str
) -> None:
    with pytest.raises(PluginError) as raised:
        _fault(pm, case)
    assert (raised.value.plugin, raised.value.hook) == ("vendor", hook)


# --- B5: the report names the plugins behind the backend and the selector ---------------------------


def test_the_report_names_the_plugin_that_took_over_a_backend_name(on_path: Path) -> None:
    pm = torchkiln.PluginManager(env={"TORCHKILN_PLUGINS": "zeta"})
    model = Stack(depth=2)
    with pytest.warns(RuntimeWarning, match="'eager' is declared by both"):
        torchkiln.compile(model, backend="eager", regions="zeta", plugins=pm)
    model(torch.randn(2, 8))
    report = torchkiln.report(model)
    assert (report.backend_plugin, report.selector_plugin) == ("zeta", "zeta")
    title = str(report).splitlines()[0]
    assert (
        title
        == "torchkiln compile report: backend eager (plugin zeta), selector repeated (plugin zeta)"
    )
    assert report.to_dict()["backend_plugin"] == "zeta"


# --- B6: messages read well -------------------------------------------------------------------------


def test_bad_declaration_messages_have_no_doubled_quotes_and_cut_reprs_end_with_dots(
    pm: torchkiln.PluginManager,
) -> None:
    class Long:
        @hookimpl
        def declare_backends(self):
            return [BackendSpec("long", probe=lambda: None), ("x" * 200,)]

        @hookimpl
        def compile_region(self, fn):
            return fn

    pm.register(Long(), name="x")
    with pytest.warns(RuntimeWarning) as caught:
        pm.backends()
    message = str(caught[-1].message)
    assert "''" not in message
    assert "its declare_backends() returned list containing tuple ('xxx" in message
    shown = message.split("containing tuple ")[1].split(";")[0]
    assert shown.endswith("...") and len(shown) <= 80


# --- F4: a wrapping backend hands its graph to torch's --------------------------------------------


def test_a_wrapping_backend_hands_its_graph_to_aot_eager(pm: torchkiln.PluginManager) -> None:
    seen: list[int] = []

    def acme_backend(graph_module, example_inputs):
        seen.append(len(graph_module.graph.nodes))
        return torch_backend("aot_eager")(graph_module, example_inputs)

    class Wrapping:
        @hookimpl
        def declare_backends(self):
            return [BackendSpec("wrapping", modes=(), options=())]

        @hookimpl
        def compile_region(self, fn, group, config, backend):
            return compile_with_torch(fn, config, backend=acme_backend)

    pm.register(Wrapping(), name="wrapping")
    model = Stack(depth=3)
    x = torch.randn(2, 8)
    expected = model(x)
    torchkiln.compile(model, backend="wrapping", plugins=pm)
    torch.testing.assert_close(model(x), expected)
    # The blocks' graph went through the wrapper (one compiled function for the three blocks).
    assert seen and seen[0] > 2 and len(set(seen)) == 1
    with pytest.raises(ValueError, match="torch knows no backend 'inductr'; known: "):
        torch_backend("inductr")


# --- F8: precedence between installed plugins ------------------------------------------------------

CLAIMS = """
    from torchkiln import hookimpl
    from torchkiln.plugin import BackendSpec

    @hookimpl
    def declare_backends():
        return [BackendSpec("shared", "{name}'s")]

    @hookimpl
    def compile_region(fn):
        return fn
"""


@pytest.mark.parametrize("alpha_found_first", [True, False])
def test_the_winner_of_a_name_two_installed_plugins_declare_is_deterministic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alpha_found_first: bool
) -> None:
    alpha = write_plugin(tmp_path / "a", "alpha", CLAIMS.replace("{name}", "alpha"))
    beta = write_plugin(tmp_path / "b", "beta", CLAIMS.replace("{name}", "beta"))
    for folder in (beta, alpha) if alpha_found_first else (alpha, beta):
        monkeypatch.syspath_prepend(str(folder))  # the last prepended is found first
    try:
        for env, winner in (
            ({}, "alpha"),  # by entry-point name
            ({"TORCHKILN_PLUGINS": "beta,alpha"}, "beta"),  # in the order listed
            ({"TORCHKILN_PLUGINS": "alpha, beta"}, "alpha"),
        ):
            with pytest.warns(RuntimeWarning, match="'shared' is declared by both"):
                declared = torchkiln.PluginManager(env=env).backends()["shared"]
            assert declared.plugin == winner, env
    finally:
        sys.modules.pop("alpha", None)
        sys.modules.pop("beta", None)
