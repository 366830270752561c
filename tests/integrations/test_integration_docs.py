"""The integration pages' examples run: every ```` ```python ```` block of a page, in order, in
one namespace and a scratch directory (```` notest ```` blocks and other languages are not
run)."""

from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
PAGES = {
    "double-compile.md": ["transformers"],
    "torch-releases.md": [],
    "integrations/accelerate.md": ["accelerate", "transformers"],
    "integrations/transformers-trainer.md": ["accelerate", "transformers"],
    "integrations/lightning.md": ["lightning", "transformers"],
}


def python_blocks(page: Path) -> list[tuple[int, str]]:
    text = page.read_text()
    return [
        (text.count("\n", 0, match.start()) + 2, match["body"])
        for match in FENCE.finditer(text)
        if match["info"].split()[:1] == ["python"] and "notest" not in match["info"].split()
    ]


@pytest.mark.slow
@pytest.mark.parametrize("page", list(PAGES))
def test_docs_examples_run(page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for requirement in PAGES[page]:
        pytest.importorskip(requirement)
    if "accelerate" in PAGES[page]:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
    blocks = python_blocks(DOCS / page)
    assert blocks, f"{page} has no python example"
    module = types.ModuleType("docs_" + re.sub(r"\W", "_", page))  # Dynamo and pickle find classes
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    environment = dict(os.environ)
    try:
        for line, body in blocks:
            exec(compile(body, f"{page}:{line}", "exec"), namespace)  # the page's own example
    finally:
        os.environ.clear()
        os.environ.update(environment)
        from torchkiln.compat.accelerate import uninstall

        uninstall()
