"""``tools/private_names.py`` (run by ``tox -e lint``) on small trees of its own: what it
reports, and what passes."""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import ModuleType

import pytest
from tool_modules import load_tool


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    return load_tool("private_names")


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_reports_uses_outside_the_adapter_and_passes_the_adapter_and_getframe(
    tool: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _tree(
        tmp_path,
        {
            "core/_internals/dynamo.py": """
                import torch._dynamo.eval_frame as eval_frame

                def stance():
                    return eval_frame._stance

                def set_parser(owner, parser):
                    owner._template_from_string = parser
            """,
            "core/engine/other.py": """
                class Elsewhere:
                    def __init__(self):
                        self._orig_mod = None  # defined here: no pass for other files
            """,
            "core/engine/uses.py": """
                import sys
                import torch._dynamo.utils
                from transformers.utils.output_capturing import _active_collector

                class Own:
                    def __init__(self):
                        self._mine = 1

                def calls(model, owner):
                    frame = sys._getframe(1)
                    own = Own()._mine
                    registry = getattr(model, "_CAN_RECORD_REGISTRY", None)
                    return owner._template_from_string, model._orig_mod
            """,
        },
    )
    monkeypatch.chdir(tmp_path)
    assert tool.main(["core"]) == 1
    found = capsys.readouterr().out.splitlines()
    assert found == [
        "core/engine/uses.py:3: torch._dynamo.utils",
        "core/engine/uses.py:4: transformers.utils.output_capturing._active_collector",
        "core/engine/uses.py:13: _CAN_RECORD_REGISTRY",
        # Defined in another of torchkiln's files, or set by the adapter on torch's class:
        # still torch's name, not this file's own.
        "core/engine/uses.py:14: _orig_mod",
        "core/engine/uses.py:14: _template_from_string",
    ]


def test_a_tree_without_private_names_passes(
    tool: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(
        tmp_path,
        {
            "plugins/plain.py": "import torch\n\ndef f(x):\n    return torch.compiler.is_compiling()\n"
        },
    )
    monkeypatch.chdir(tmp_path)
    assert tool.main(["plugins"]) == 0
