"""Shown output in the docs: a ```` ```python ```` block immediately followed by a
```` ```text ```` (or ``console``/``output``) block shows what the code prints, and the doc
runners assert it. Timings differ per run, so decimals compare as ``N.N`` and runs of spaces
(table columns sized by those numbers) as one space."""

from __future__ import annotations

import re

OUTPUT_LANGUAGES = ("text", "console", "output")
_DECIMAL = re.compile(r"\d+\.\d+")
_SPACES = re.compile(r" +")


def normalized(text: str) -> str:
    lines = [_SPACES.sub(" ", _DECIMAL.sub("N.N", line)).rstrip() for line in text.splitlines()]
    return "\n".join(lines).strip("\n")


def assert_shown_output(printed: str, shown: str, where: str) -> None:
    assert normalized(printed) == normalized(shown), (
        f"{where}: the docs show\n{shown}\nbut the code printed\n{printed}"
    )
