"""``docs/migrating-from-accelerate.md`` is true: its examples run and its tables match the code.

Fenced blocks, by info string:

- ```` ```python ````: run in page order in one namespace, in a scratch directory;
  ```` ```python needs=accelerate ```` only when Accelerate is installed;
- ```` ```yaml file=NAME ````: written to ``NAME`` in that directory;
- ```` ```yaml output=import-accelerate:NAME ````: exactly what
  ``torchkiln config import-accelerate NAME`` prints there;
- ```` notest ```` and other languages: not run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import types
from pathlib import Path

import pytest

from torchkiln.cli.commands import main
from torchkiln.compat.accelerate_settings import BACKEND_MAP

PAGE = Path(__file__).resolve().parents[2] / "docs" / "migrating-from-accelerate.md"
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def fenced_blocks() -> list[tuple[str, dict[str, str], set[str], str, int]]:
    text = PAGE.read_text()
    found = []
    for match in FENCE.finditer(text):
        words = match["info"].split()
        language = words[0] if words else ""
        extras = dict(word.split("=", 1) for word in words[1:] if "=" in word)
        flags = {word for word in words[1:] if "=" not in word}
        line = text.count("\n", 0, match.start()) + 2
        found.append((language, extras, flags, match["body"], line))
    return found


def test_examples_run(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    has_accelerate = importlib.util.find_spec("accelerate") is not None
    if has_accelerate:  # the page builds its own Accelerator: no earlier test's state
        request.getfixturevalue("fresh_accelerate")
    namespace: dict[str, object] = {"__name__": "docs_migrating_from_accelerate"}
    module = types.ModuleType(namespace["__name__"])  # so Dynamo can find example classes
    monkeypatch.setitem(__import__("sys").modules, module.__name__, module)
    environment = dict(os.environ)
    ran = 0
    try:
        for language, extras, flags, body, line in fenced_blocks():
            if "notest" in flags:
                continue
            if "file" in extras:
                Path(extras["file"]).write_text(body)
            elif "output" in extras:
                command, _, argument = extras["output"].partition(":")
                assert command == "import-accelerate"
                capsys.readouterr()
                assert main(["config", "import-accelerate", argument]) == 0
                assert capsys.readouterr().out == body, f"output block at line {line}"
            elif language == "python":
                if extras.get("needs") == "accelerate" and not has_accelerate:
                    continue
                code = compile(body, f"{PAGE.name}:{line}", "exec")
                exec(code, namespace)  # the page's own example code
                ran += 1
    finally:
        os.environ.clear()
        os.environ.update(environment)
        if has_accelerate:
            from torchkiln.compat.accelerate import uninstall

            uninstall()
    assert ran >= 9


def test_backend_table_matches_the_mapping() -> None:
    text = PAGE.read_text()
    section = text.split("### Backend names", 1)[1].split("###", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (?:`(\w+)`|—) \|", section, re.MULTILINE)
    documented = {name: target or None for name, target in rows}
    assert documented == {
        member.value: mapping.torchkiln for member, mapping in BACKEND_MAP.items()
    }


def test_variable_table_names_all_five_variables() -> None:
    text = PAGE.read_text()
    for name in ("BACKEND", "MODE", "USE_FULLGRAPH", "USE_DYNAMIC", "USE_REGIONAL_COMPILATION"):
        assert f"| `ACCELERATE_DYNAMO_{name}` | `dynamo_{name.lower()}`" in text
