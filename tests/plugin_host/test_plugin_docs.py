"""Every code example in the plugin-author docs (``docs/plugins/*.md``, ``docs/hooks.md``) runs.

How a page's fenced blocks are treated, by their info string:

- ```` ```python ````: run, in page order, in one namespace per page, in a scratch directory
  that is also on ``sys.path``;
- ```` ```python file=NAME ```` (or ``toml file=NAME``): written to ``NAME`` in that directory
  (so later blocks can import it); a ``test_*.py`` file is then run with pytest, which must pass;
- ```` ```python ```` immediately followed by ```` ```text ```` (or ``console``/``output``):
  what the block prints to standard output must be that text (``doc_output``);
- ```` ```python signature ```` and ```` ```python notest ````, and other languages: not run
  (signatures are checked by ``test_hook_docs.py``; ``notest`` marks code that needs hardware).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import attrs
import pytest
from doc_output import OUTPUT_LANGUAGES, assert_shown_output

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
    shown_output: str | None = None
    """The output block right after this one (only whitespace between), if there is one."""


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    matches = list(FENCE.finditer(text))
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        words = match["info"].split()
        language = words[0] if words else ""
        extras = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        skip = "notest" in words or "signature" in words
        line = text.count("\n", 0, match.start()) + 2
        shown = _shown_output(text, match, following)
        found.append(Block(language, extras.get("file"), skip, match["body"], line, shown))
    return found


def _shown_output(text: str, block: re.Match[str], following: re.Match[str] | None) -> str | None:
    if following is None or text[block.end() : following.start()].strip():
        return None
    words = following["info"].split()
    return following["body"] if words and words[0] in OUTPUT_LANGUAGES else None


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
            run_block(block, page.name, module)
    for name in written:
        sys.modules.pop(name.removesuffix(".py"), None)


def run_block(block: Block, page_name: str, module: types.ModuleType) -> None:
    where = f"{page_name}:{block.line}"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block.code, where, "exec"), module.__dict__)
    if block.shown_output is not None:
        assert_shown_output(printed.getvalue(), block.shown_output, where)


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


def test_shown_output_is_compared_with_what_the_block_prints(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nprint('took  1.5 s')\n```\n\n```text\ntook 2.25 s\n```\n\n"
        "```python\nprint('b')\n```\nprose in between: not shown output\n```text\nz\n```\n\n"
        "```python\nprint('c')\n```\n\n```console\nd\n```\n"
    )
    found = [b.shown_output for b in blocks(page) if b.language == "python"]
    assert found == ["took 2.25 s\n", None, "d\n"]
    try:
        with pytest.raises(AssertionError, match=r"page.md:\d+: the docs show\nd\n"):
            run_page(page, tmp_path)
    finally:
        sys.modules.pop("docs_example_page", None)
