"""Tiered compilation in a job of several ranks: one builder for the job, one switch step.

Rank 0 alone runs a builder. At each call while the build is pending, every rank takes part in
one broadcast from rank 0: ``None`` while it builds, then the form's files (or its failure),
which every rank writes into a directory of its own and switches to at that same call
(docs/tiered.md, "Distributed").
"""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path
from typing import Any

from torchkiln.artifacts.directory import entry_path
from torchkiln.jobs.exchange import JobExchange

STATE = "the whole-model build's state"


class JobTiers:
    """The tiers' part of a job: who builds, and the per-call agreement."""

    def __init__(self, exchange: JobExchange):
        self.exchange = exchange

    @property
    def builds_here(self) -> bool:
        return self.exchange.rank == 0

    def agree(self, result: dict[str, Any] | None, output: Path | None) -> dict[str, Any] | None:
        """Rank 0's builder result at this call, on every rank (``None``: still building).

        On rank 0, ``result`` is what its builder's ``poll()`` gave and ``output`` its
        directory; a finished result travels with the directory's files (``"files"``)."""
        message = b""  # nothing yet
        if self.builds_here and result is not None:
            files = _read_tree(output) if result.get("ok") and output is not None else {}
            message = pickle.dumps({"result": result, "files": files})
        data = self.exchange.broadcast(message, 0, STATE)
        return pickle.loads(data) if data else None

    @staticmethod
    def write(files: dict[str, bytes]) -> Path:
        """The directory rank 0 sent, written into a new directory of this rank's."""
        directory = Path(tempfile.mkdtemp(prefix="torchkiln-whole-"))
        for relative, data in files.items():
            path = entry_path(directory, relative)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return directory


def _read_tree(directory: Path) -> dict[str, bytes]:
    """Every regular file under ``directory``, by relative path (the manifest checks them when
    the receiving rank loads)."""
    return {
        path.relative_to(directory).as_posix(): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }
