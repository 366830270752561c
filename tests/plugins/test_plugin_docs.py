"""Every code example in the plugin-author docs (``docs/plugins/*.md``, ``docs/hooks.md``) runs.

How a page's fenced blocks are treated, by their info string:

- ```` ```python ````: run, in page order, in one namespace per page, in a scratch directory
  that is also on ``sys.path``;
- ```` ```python file=NAME ```` (or ``toml file=NAME``): written to ``NAME`` in that directory
  (so later blocks can import it); a ``test_*.py`` file is then run with pytest, which must pass;
- ```` ```python signature ```` and ```` ```python notest ````, and other languages: not run
  (signatures are checked by ``test_hook_docs.py``; ``notest`` marks code that needs hardware).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import attrs
import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted([*DOCS.glob("plugins/*.md"), DOCS / "hooks.md"])
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)


@attrs.frozen
class Block:
    language: str
    file: str | None
    skip: bool
    code: str
    line: int


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        words = match["info"].split()
        language = words[0] if words else ""
        extras = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        skip = "notest" in words or "signature" in words
        line = text.count("\n", 0, match.start()) + 2
        found.append(Block(language, extras.get("file"), skip, match["body"], line))
    return found


def run_page(page: Path, workdir: Path) -> None:
    # A real module, so that Dynamo (and pickle) can find classes the examples define.
    module = types.ModuleType(f"docs_example_{page.stem.replace('-', '_')}")
    sys.modules[module.__name__] = module
    written: list[str] = [module.__name__]
    for block in blocks(page):
        if block.file:
            (workdir / block.file).write_text(block.code)
            written.append(block.file.removesuffix(".py"))
            if block.file.startswith("test_") and block.file.endswith(".py"):
                run_pytest(workdir, block.file, f"{page.name}:{block.line}")
        elif block.language == "python" and not block.skip:
            exec(compile(block.code, f"{page.name}:{block.line}", "exec"), module.__dict__)
    for name in written:
        sys.modules.pop(name.removesuffix(".py"), None)


def run_pytest(workdir: Path, test_file: str, where: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(workdir), *sys.path])}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
        cwd=workdir, capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, (
        f"{where}: pytest failed\n{result.stdout[-4000:]}{result.stderr[-2000:]}"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_docs_examples_run(page, tmp_path, monkeypatch):
    runnable = [b for b in blocks(page) if b.file or (b.language == "python" and not b.skip)]
    assert runnable, f"{page} has no runnable example"
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_page(page, tmp_path)


def test_plugin_guide_pages_exist():
    names = {p.name for p in DOCS.glob("plugins/*.md")}
    assert {"index.md", "backend.md", "selector.md", "distributed.md", "packaging.md",
            "testing.md", "vendors.md"} <= names  # fmt: skip
