"""docs/reference/*.md are Markdown written from the docstrings (readable without building the
site, issue 25 F5) and kept in sync with them."""

from __future__ import annotations

import difflib

from api_reference import PAGES, REFERENCE, out_of_date, render


def test_reference_pages_match_the_docstrings() -> None:
    stale = out_of_date()
    diff = "".join(
        line
        for page in stale
        for line in difflib.unified_diff(
            (REFERENCE / page).read_text().splitlines(True), render(page).splitlines(True)
        )
    )
    assert stale == [], (
        f"docs/reference is out of date: run python tests/docs/api_reference.py --write\n{diff}"
    )


def test_reference_pages_hold_the_public_api_as_text() -> None:
    torchkiln_page = render("torchkiln.md")
    assert "## `torchkiln.pipeline.compile`" in torchkiln_page
    assert ":::" not in "".join((REFERENCE / page).read_text() for page in PAGES)
    plugin_page = render("plugin.md")
    for name in ("BackendSpec", "SelectorSpec", "torch_backend", "probe_import", "RegionPlan"):
        assert f".{name}`" in plugin_page, name
