"""docs/plugins.md stays true: its Python examples run, its tables name exactly the built-in
plugins and the plugin environment controls, and the messages it quotes are the real ones."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch
from stack_model import Stack

import torchkiln
from torchkiln.cli import commands as cli
from torchkiln.configuration.config_sources import CONTROL_VARIABLES
from torchkiln.plugin_host.plugin_manager import FailedPlugin, builtin_name
from torchkiln.plugins import BUILTIN_PLUGINS

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
TEXT = DOC.read_text(encoding="utf-8")
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
BLOCKS = [(m["info"].strip(), m["body"]) for m in FENCE.finditer(TEXT)]
PYTHON = [body for info, body in BLOCKS if info == "python"]


def table_after(heading_text: str) -> list[list[str]]:
    """Rows (cells) of the first Markdown table after ``heading_text``."""
    rest = TEXT[TEXT.index(heading_text) :]
    lines = rest[rest.index("\n|") + 1 :].splitlines()
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows[2:]  # header and separator


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


@pytest.mark.parametrize("body", PYTHON, ids=[f"python-{i}" for i in range(len(PYTHON))])
def test_python_examples_run(body: str) -> None:
    exec(compile(body, f"{DOC}:python", "exec"), {})


def test_the_environment_controls_table_names_exactly_the_plugin_controls() -> None:
    documented = {
        ticked(row[0])[0].split("=")[0] for row in table_after("## Choosing which plugins load")
    }
    assert documented == CONTROL_VARIABLES - {
        "TORCHKILN_CONFIG",
        "TORCHKILN_ACCELERATE_CONFIG",
        "TORCHKILN_ON_DOUBLE_COMPILE",  # docs/double-compile.md
    }
    from torchkiln.plugin_host import plugin_manager

    for name in documented:  # the module docstring documents the same variables
        assert f"``{name}" in (plugin_manager.__doc__ or "")


def test_the_builtin_table_names_every_builtin_and_what_it_declares(
    pm: torchkiln.PluginManager,
) -> None:
    rows = table_after("### Built-in plugins")
    assert [ticked(row[0])[0] for row in rows] == [builtin_name(m) for m in BUILTIN_PLUGINS]
    for row in rows:
        module = importlib.import_module(
            BUILTIN_PLUGINS[[builtin_name(m) for m in BUILTIN_PLUGINS].index(ticked(row[0])[0])]
        )
        declared = {
            spec.name
            for hook in (
                "declare_backends",
                "declare_selectors",
                "declare_distributed",
                "declare_layer_caches",
            )
            if hasattr(module, hook)
            for spec in getattr(module, hook)()
        }
        mentioned = set(ticked(row[1]))
        assert mentioned <= declared, (row[0], mentioned - declared)
        if declared:
            assert mentioned, row[0]


def test_the_json_keys_table_matches_torchkiln_plugins_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHKILN_DISABLE_PLUGIN_AUTOLOAD", "1")
    listing = cli.plugins_listing()
    rows = {ticked(row[0])[0]: ticked(row[2]) for row in table_after("The JSON has these keys")}
    assert set(rows) == set(listing)
    for key, fields in rows.items():
        assert listing[key] or key in ("failed", "disabled"), key
        for entry in listing[key]:
            if key == "disabled":
                assert isinstance(entry, str)
                continue
            assert list(entry) == fields, key
    sample_failure = FailedPlugin("x", "x", "x-dist", "1.0", "RuntimeError: boom")
    assert list(torchkiln.plugin_host.plugin_info.attrs.asdict(sample_failure)) == rows["failed"]


def test_the_quoted_failure_warning_is_the_real_format() -> None:
    failure = FailedPlugin(
        "brokenplug",
        "brokenplug",
        "brokenplug-dist",
        "1.2.0",
        "RuntimeError: brokenplug cannot find its SDK",
    )
    assert f"```text\n{failure.describe()}\n```" in TEXT


def test_the_quoted_trace_lines_match_real_trace_output(capsys: pytest.CaptureFixture[str]) -> None:
    manager = torchkiln.PluginManager(entry_points=False, env={"TORCHKILN_TRACE_PLUGINS": "1"})
    model = Stack()
    torchkiln.compile(model, plugins=manager, backend="eager", progress="off")
    model(torch.randn(2, 8))
    actual = capsys.readouterr().err.splitlines()
    quoted = [
        line
        for info, body in BLOCKS
        if info == "text" and body.startswith("torchkiln: hook")
        for line in body.splitlines()
    ]
    assert len(quoted) == 4
    for line in quoted:
        pattern = ".*".join(re.escape(part) for part in line.split("..."))
        assert any(re.fullmatch(pattern, real) for real in actual), line
