"""``job.store``: a directory of shared entries that outlives the job, safe with many writers.

An entry is written aside and published with one ``rename`` of its directory: a reader sees all
of it or none, and of two writers of one key the first rename wins and the second removes its
own copy (a rename onto a non-empty directory fails). Nothing holds a lock: a writer killed
mid-write leaves only its hidden directory, which a store opened an hour later removes. Only
names this module writes are ever touched; a corrupted entry (its files do not match its
``meta.json``) is moved aside and removed, so a later writer can publish a good one.
:class:`JobStore` shows the layout; docs/jobs.md ("The store") says how a job uses it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path

from torchkiln.artifacts.directory import META, ArtifactError

ENTRIES = "entries"
STALE_SECONDS = 3600.0
"""A hidden staging directory older than this was left by a killed writer and is removed."""
_KEY = re.compile(r"[0-9a-f]{64}")
_STAGING = re.compile(r"\.[0-9a-f]{16}\.[^/]*\.(\d+)\.[^/]+")
_ASIDE = re.compile(r"\.[0-9a-f]{64}\.aside-[^/]+")


class JobStore:
    """One ``job.store`` directory (``section`` ``entries``), or another section of a store
    whose entries are published the same way (``whole``: whole-model forms).

    Layout::

        entries/<key>/           one entry per key (:mod:`torchkiln.jobs.keys`), never changed
            meta.json            the key's fields, the kind, and the size and SHA-256 of every file
            entry.bin            torch's saved compiled function
            kernels/...          the inductor cache files its compile wrote
        entries/.<key16>.<host>.<pid>.<random>   an entry being written (hidden, never read)
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        section: str = ENTRIES,
        marker: str = META,
        writable: bool = True,
    ):
        self.root = Path(root).expanduser().resolve()
        self.entries = self.root / section
        self.marker = marker
        if not writable:  # a precompiled directory (artifacts=): read, never changed
            return
        try:
            self.entries.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ArtifactError(
                f"job.store {str(root)!r} cannot be created: {error.strerror or error}"
            ) from error
        self.sweep()

    def published(self) -> list[Path]:
        """Every published entry, in key order."""
        try:
            names = sorted(os.listdir(self.entries))
        except OSError:
            return []
        return [
            self.entries / name
            for name in names
            if _KEY.fullmatch(name) and (self.entries / name / self.marker).is_file()
        ]

    def find(self, key: str) -> Path | None:
        """The published entry of ``key``, or ``None``."""
        _check_key(key)
        path = self.entries / key
        return path if (path / self.marker).is_file() else None

    def staging(self, key: str) -> Path:
        """A new hidden directory to write ``key``'s entry into."""
        _check_key(key)
        host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"
        return Path(tempfile.mkdtemp(dir=self.entries, prefix=f".{key[:16]}.{host}.{os.getpid()}."))

    def publish(self, staging: Path, key: str) -> Path:
        """Put ``staging`` in place as ``key``'s entry; when another writer was first, keep
        theirs and remove ``staging``. Returns the published entry."""
        target = self.entries / key
        os.chmod(staging, 0o755)  # mkdtemp made it private; every rank of the job reads it
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / self.marker).is_file():
                raise
            shutil.rmtree(staging, ignore_errors=True)
        return target

    def discard(self, key: str) -> None:
        """Move a corrupted entry aside and remove it (a good one may then be published)."""
        _check_key(key)
        aside = self.entries / f".{key}.aside-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(self.entries / key, aside)
            shutil.rmtree(aside, ignore_errors=True)

    def sweep(self) -> list[str]:
        """Remove what killed writers left (hidden staging or aside directories older than
        :data:`STALE_SECONDS`); returns their names."""
        now = time.time()
        removed = []
        with contextlib.suppress(OSError):
            for name in os.listdir(self.entries):
                if not (_STAGING.fullmatch(name) or _ASIDE.fullmatch(name)):
                    continue
                path = self.entries / name
                with contextlib.suppress(OSError):
                    if now - path.lstat().st_mtime > STALE_SECONDS and path.is_dir():
                        shutil.rmtree(path, ignore_errors=True)
                        removed.append(name)
        return removed


def _check_key(key: str) -> None:
    if not _KEY.fullmatch(key):
        raise ArtifactError(f"{key!r} is not a store key (64 hexadecimal digits)")
