"""docs/guide.md: every example file in docs/examples/ runs (each asserts what the guide says),
and every Python block the guide shows from one is that file, verbatim."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from torchkiln._internals.versions import feature_problem
from torchkiln.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
GUIDES = [
    REPO / "docs" / "guide.md",
    REPO / "docs" / "tiered.md",
    REPO / "docs" / "store.md",
    REPO / "docs" / "serving.md",
]
EXAMPLES = REPO / "docs" / "examples"
FENCE = re.compile(r"^```python\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
SOURCE = re.compile(r"\A# (?P<path>docs/examples/\S+\.py)\n")


def shown_examples() -> dict[str, str]:
    """Guide blocks that start with ``# docs/examples/NAME.py``: path -> the code after it."""
    shown = {}
    for match in (m for guide in GUIDES for m in FENCE.finditer(guide.read_text())):
        source = SOURCE.match(match["body"])
        if source:
            shown[source["path"]] = match["body"][source.end() :]
    return shown


EXAMPLE_FILES = sorted(EXAMPLES.glob("*.py"))


def test_every_example_is_shown_verbatim() -> None:
    shown = shown_examples()
    assert sorted(shown) == [f"docs/examples/{path.name}" for path in EXAMPLE_FILES]
    for path, code in shown.items():
        assert code == (REPO / path).read_text(), f"{path} differs from its block in the guide"


EXAMPLE_FEATURES = {"tiered": "tiered compilation", "store": "tiered compilation"}
"""Examples of a feature some supported torch releases lack: there, the example is refused with
a ConfigError naming the feature and the release, which is what the test checks instead."""
EXAMPLE_NEEDS = {"store_write_back": "precompiled artifacts"}
"""Examples of what a store does only where torch can save compiled code: elsewhere a store
keeps inductor's kernels and the report's ``job:`` line says why no entry is written (tested in
tests/jobs), so the example has nothing to show there."""


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda path: path.stem)
def test_example_runs(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if path.stem in EXAMPLE_NEEDS and (problem := feature_problem(EXAMPLE_NEEDS[path.stem])):
        pytest.skip(problem)
    missing = (
        feature_problem(EXAMPLE_FEATURES[path.stem]) if path.stem in EXAMPLE_FEATURES else None
    )
    if missing is not None:
        with pytest.raises(ConfigError) as refused:
            runpy.run_path(str(path), run_name="__main__")
        assert missing in str(refused.value)
        return
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out.strip()  # each example prints what it shows
