"""Files written so that a reader never sees half of one: every writer of torchkiln uses it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(
    path: str | os.PathLike[str], data: bytes | str, *, mode: int | None = None
) -> None:
    """Write ``data`` (text as UTF-8) to ``path``: to a temporary file beside it, then renamed
    over it, so a reader (another rank, a run killed mid-write) sees the previous complete file
    or the new one, never half. A link at ``path`` is replaced itself, never its target.

    :param mode: the file's permission bits (``None``: ``mkstemp``'s 0600, the writer's own).
    """
    target = Path(path)
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
