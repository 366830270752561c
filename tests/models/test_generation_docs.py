"""docs/generation.md: every Python block runs, each in a fresh Dynamo."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "generation.md"
FENCE = re.compile(r"^```python\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
BLOCKS = [match["body"] for match in FENCE.finditer(DOC.read_text())]


def test_the_page_has_its_examples() -> None:
    assert len(BLOCKS) == 2


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=["generate", "plugin"])
def test_block_runs(
    index: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    reset_dynamo: None,
    torchkiln_clean_environment: None,
) -> None:
    pytest.importorskip("transformers")
    # Imported as a module of its own (Dynamo looks a frame's globals up by module name);
    # never as __main__, which other documentation tests run their examples as.
    name = f"docs_generation_example_{index}"
    (tmp_path / f"{name}.py").write_text(BLOCKS[index])
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module(name)
    finally:
        sys.modules.pop(name, None)
