"""Installed plugins without pip: a module plus the ``.dist-info`` pip would leave beside it.

``importlib.metadata`` finds a distribution by its ``*.dist-info`` directory on ``sys.path``,
so a folder holding both is, for torchkiln, an installed plugin distribution: put the folder on
``sys.path`` (in-process) or ``PYTHONPATH`` (a subprocess).
"""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_plugin(
    folder: Path, module: str, source: str, *, dist: str | None = None, version: str = "1.0"
) -> Path:
    """Write ``module``'s ``source`` and a distribution ``dist`` (default ``MODULE-dist``)
    whose ``torchkiln`` entry point, named ``module``, loads it. Returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = dist or f"{module}-dist"
    (folder / f"{module}.py").write_text(textwrap.dedent(source).lstrip(), encoding="utf-8")
    info = folder / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(f"[torchkiln]\n{module} = {module}\n", encoding="utf-8")
    return folder
