"""``job.store``: a directory of shared entries that outlives the job, safe with many writers.

An entry is written aside and published with one ``rename`` of its directory: a reader sees all
of it or none, and of two writers of one key the first rename wins and the second removes its
own copy (a rename onto a non-empty directory fails). Nothing holds a lock: a writer killed
mid-write leaves only its hidden directory, named after its writer (host, pid, process start
time): a later store removes it once that writer is gone, or, for a writer on another host, a
day later. Only names this module writes are ever touched; a corrupted entry (its files do not
match its ``meta.json``) is moved aside and removed, so a later writer can publish a good one.
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
OTHER_HOST_STALE_SECONDS = 24 * 3600.0
"""A staging directory of another host's writer (whose process cannot be looked up from here)
older than this is removed: longer than a paused or niced whole-model build takes."""
ASIDE_STALE_SECONDS = 3600.0
"""An aside directory is only ever being removed; older than this, its remover was killed."""
_OLDER_LAYOUT_STALE_SECONDS = 3600.0
"""The older staging names record no start time: removed by their old rule (an hour old),
and now only when no process has their pid on this host."""
_KEY = re.compile(r"[0-9a-f]{64}")
_STAGING = re.compile(
    r"\.[0-9a-f]{16}\.(?P<host>[^/.]*)\.(?P<pid>\d+)\.(?:(?P<start>\d+)\.)?[^/.]+"
)
"""``.<key16>.<host>.<pid>.<start>.<random>``; before the start time was recorded,
``.<key16>.<host>.<pid>.<random>`` (``start`` is then ``None``)."""
_ASIDE = re.compile(r"\.[0-9a-f]{64}\.aside-[^/]+")


class JobStore:
    """One ``job.store`` directory (``section`` ``entries``), or another section of a store
    whose entries are published the same way (``whole``: whole-model forms).

    Layout::

        entries/<key>/           one entry per key (:mod:`torchkiln.jobs.keys`), never changed
            meta.json            the key's fields, the kind, and the size and SHA-256 of every file
            entry.bin            torch's saved compiled function
            kernels/...          the inductor cache files its compile wrote
        entries/.<key16>.<host>.<pid>.<start>.<random>   an entry being written (hidden, never
                             read), named after its writer so that a sweep can tell
                             whether it still runs (:func:`writer_gone`)
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
        pid = os.getpid()
        writer = f"{this_host()}.{pid}.{process_start(pid) or 0}"
        return Path(tempfile.mkdtemp(dir=self.entries, prefix=f".{key[:16]}.{writer}."))

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
        """Remove what killed writers left: staging directories whose writer is gone
        (:func:`writer_gone`) and aside directories older than :data:`ASIDE_STALE_SECONDS`;
        returns their names."""
        now = time.time()
        removed = []
        with contextlib.suppress(OSError):
            for name in os.listdir(self.entries):
                if not (_STAGING.fullmatch(name) or _ASIDE.fullmatch(name)):
                    continue  # a published entry, or a name this module does not write
                path = self.entries / name
                with contextlib.suppress(OSError):
                    if _left_behind(name, now - path.lstat().st_mtime) and path.is_dir():
                        shutil.rmtree(path, ignore_errors=True)
                        removed.append(name)
        return removed


def _left_behind(name: str, age: float) -> bool:
    """Whether the hidden directory ``name``, last changed ``age`` seconds ago, was left by a
    writer that is gone (``False`` for every name this module does not write)."""
    staging = _STAGING.fullmatch(name)
    if staging is None:
        return _ASIDE.fullmatch(name) is not None and age > ASIDE_STALE_SECONDS
    host, pid = staging["host"], int(staging["pid"])
    if staging["start"] is None:  # the older layout: host name only, no start time
        if host != _host_name():
            return age > OTHER_HOST_STALE_SECONDS
        return age > _OLDER_LAYOUT_STALE_SECONDS and not _pid_exists(pid)
    return writer_gone(host, pid, int(staging["start"]), age)


def writer_gone(host: str, pid: int, start: int, age: float) -> bool:
    """Whether the writer of a staging directory ``age`` seconds old no longer runs.

    On this host (:func:`this_host`) its process is looked up: gone when no process has that
    pid, when it is a zombie, or when the process with that pid started at another time than
    ``start`` (the pid was reused; 0: not recorded, as on a system without ``/proc``).
    Another host's processes cannot be looked up: its directory is gone after
    :data:`OTHER_HOST_STALE_SECONDS`.
    """
    if host != this_host():
        return age > OTHER_HOST_STALE_SECONDS
    if not _pid_exists(pid):
        return True
    status = _proc_stat(pid)
    if status is None:  # no /proc (macOS), or it vanished just now: count it as running
        return False
    state, started = status
    return state == "Z" or (start != 0 and started != start)


def this_host() -> str:
    """This host as staging names record it: the host name and, where the system has them, the
    pid namespace, so that containers that share a host name and a store but not their pids
    count as different hosts."""
    try:
        namespace = re.sub(r"\D", "", os.readlink("/proc/self/ns/pid"))
    except OSError:
        return _host_name()
    return f"{_host_name()}-ns{namespace}" if namespace else _host_name()


def _host_name() -> str:
    """The host name in a staging name: letters, digits and ``-``, at most 40."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc``), or ``None``."""
    status = _proc_stat(pid)
    return status[1] if status is not None else None


def _pid_exists(pid: int) -> bool:
    if os.name == "nt":  # there os.kill(pid, 0) sends CTRL_C_EVENT: never look a pid up that way
        return True
    try:
        os.kill(pid, 0)  # signal 0: nothing is sent, only the lookup is made
    except (ProcessLookupError, OverflowError):  # no such process; no pid can be that large
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """Process ``pid``'s state letter and start time from ``/proc/<pid>/stat``, or ``None``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": comm may hold spaces
    try:
        return fields[0], int(fields[19])  # stat fields 3 (state) and 22 (starttime)
    except (IndexError, ValueError):
        return None


def _check_key(key: str) -> None:
    if not _KEY.fullmatch(key):
        raise ArtifactError(f"{key!r} is not a store key (64 hexadecimal digits)")
