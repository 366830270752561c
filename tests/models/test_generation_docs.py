"""docs/generation.md: every Python block runs, each in a fresh Dynamo."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "generation.md"
FENCE = re.compile(r"^```python\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
BLOCKS = [match["body"] for match in FENCE.finditer(DOC.read_text())]


def test_the_page_has_its_examples() -> None:
    assert len(BLOCKS) == 2


@pytest.mark.parametrize("code", BLOCKS, ids=["generate", "plugin"])
def test_block_runs(
    code: str, tmp_path: Path, reset_dynamo: None, torchkiln_clean_environment: None
) -> None:
    pytest.importorskip("transformers")
    # A file run as __main__, as a reader would run it (Dynamo looks classes up by module).
    script = tmp_path / "example.py"
    script.write_text(code)
    runpy.run_path(str(script), run_name="__main__")
