"""docs/configuration.md stays true: its field table is the generated one, it names every field
and variable, every YAML example is valid, every Python example runs, and every command-line
session prints what the page shows."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from config_reference import DOC, documented_block, render_table

import torchkiln
from torchkiln import ConfigError, cli
from torchkiln.configuration.config_sources import env_name, leaf_fields
from torchkiln.engine.resolve import resolve_config

TEXT = DOC.read_text(encoding="utf-8")
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
BLOCKS = [(m["info"].strip(), m["body"]) for m in FENCE.finditer(TEXT)]
VALID_YAML = [body for info, body in BLOCKS if info == "yaml"]
INVALID_YAML = [body for info, body in BLOCKS if info == "yaml invalid"]
PYTHON = [body for info, body in BLOCKS if info == "python"]
SESSIONS = [body for info, body in BLOCKS if info == "text" and body.startswith("$ ")]


def test_the_page_has_examples_of_every_kind() -> None:
    assert (len(VALID_YAML), len(INVALID_YAML), len(PYTHON), len(SESSIONS)) == (4, 2, 3, 4)


def test_the_field_table_is_the_generated_one() -> None:
    assert documented_block(TEXT) == render_table(), (
        "docs/configuration.md is out of date: run python tests/configuration/config_reference.py --write"
    )


@pytest.mark.parametrize("path", [path for path, _ in leaf_fields()])
def test_every_field_and_its_variable_are_documented(path: str) -> None:
    assert f"| `{path}` |" in TEXT
    assert f"`{env_name(path)}`" in TEXT


@pytest.mark.parametrize("body", VALID_YAML, ids=[f"yaml-{i}" for i in range(len(VALID_YAML))])
def test_yaml_examples_are_valid(body: str, tmp_path: Path, pm: torchkiln.PluginManager) -> None:
    path = tmp_path / "example.yaml"
    path.write_text(body, encoding="utf-8")
    resolved = resolve_config(path, plugins=pm, env={})
    set_in_file = {p for p, source in resolved.sources.items() if source == f"file:{path}"}
    assert set_in_file, "the example sets nothing"


def test_the_first_yaml_example_means_what_its_comments_say(
    tmp_path: Path, pm: torchkiln.PluginManager
) -> None:
    (tmp_path / "torchkiln.yaml").write_text(VALID_YAML[0], encoding="utf-8")
    config = resolve_config(plugins=pm, env={}, cwd=tmp_path).config
    assert (config.backend, config.mode, config.dynamic) == (
        "inductor",
        "max-autotune-no-cudagraphs",
        None,
    )
    assert (config.regions.strategy, config.regions.exclude, config.regions.rest) == (
        "repeated",
        ("lm_head",),
        "leaves",
    )
    assert (config.on_region_error, config.progress) == ("eager", "off")


def test_the_shorthand_example(tmp_path: Path, pm: torchkiln.PluginManager) -> None:
    path = tmp_path / "short.yaml"
    path.write_text(VALID_YAML[2], encoding="utf-8")
    config = resolve_config(path, plugins=pm, env={}).config
    assert (config.regions.strategy, config.distributed.strategy) == ("whole", "ddp")


@pytest.mark.parametrize("body", INVALID_YAML)
def test_invalid_yaml_examples_are_invalid(
    body: str, tmp_path: Path, pm: torchkiln.PluginManager
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(ConfigError):
        resolve_config(path, plugins=pm, env={})


@pytest.mark.parametrize("body", PYTHON, ids=[f"python-{i}" for i in range(len(PYTHON))])
def test_python_examples_run(body: str) -> None:
    exec(compile(body, f"{DOC}:python", "exec"), {})


def write_named_yaml_files(directory: Path) -> None:
    """YAML blocks whose first line is ``# NAME.yaml`` become files a session can name."""
    for info, body in BLOCKS:
        match = re.match(r"# (\S+\.yaml)\n", body)
        if info.startswith("yaml") and match:
            (directory / match[1]).write_text(body, encoding="utf-8")


def expected_lines_match(expected: list[str], actual: list[str]) -> bool:
    """Exact, except that a ``...`` line stands for any number of lines."""
    pattern = "".join(".*?" if line == "..." else re.escape(line + "\n") for line in expected)
    return re.fullmatch(pattern, "".join(line + "\n" for line in actual), re.DOTALL) is not None


@pytest.mark.parametrize("session", SESSIONS, ids=[s.splitlines()[0][2:50] for s in SESSIONS])
def test_command_line_sessions_print_what_the_page_shows(
    session: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    command, *expected = session.rstrip("\n").splitlines()
    words = shlex.split(command[2:])
    while "=" in words[0]:
        name, value = words.pop(0).split("=", 1)
        monkeypatch.setenv(name, value)
    assert words[0] == "torchkiln"
    # The page documents the built-in plugins; installed ones could add names to the lists.
    monkeypatch.setenv("TORCHKILN_DISABLE_PLUGIN_AUTOLOAD", "1")
    write_named_yaml_files(tmp_path)  # the autouse fixture made tmp_path the working directory
    code = cli.main(words[1:])
    out, err = capsys.readouterr()
    actual = (out + err).rstrip("\n").splitlines()
    assert expected_lines_match(expected, actual), "\n".join(actual)
    assert (code != 0) == expected[0].startswith("torchkiln: error:")
