"""``job.store``: many writers, nothing half-written visible, nothing foreign deleted."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchkiln.artifacts.directory import ArtifactError
from torchkiln.jobs.store import (
    ASIDE_STALE_SECONDS,
    OTHER_HOST_STALE_SECONDS,
    JobStore,
    process_start,
    this_host,
)

KEY = "ab" * 32

WRITER = """
import sys, time
from pathlib import Path
from torchkiln.jobs.store import JobStore
store = JobStore(sys.argv[1])
staging = store.staging(sys.argv[2])
(staging / "entry.bin").write_bytes(sys.argv[3].encode() * 2_000_000)
(staging / "meta.json").write_text(sys.argv[3])
while time.time() < float(sys.argv[4]):  # both publish at the same moment
    pass
print(store.publish(staging, sys.argv[2]))
"""


def test_two_writers_of_one_key_leave_one_whole_entry(tmp_path: Path) -> None:
    start = str(time.time() + 3)
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), KEY, name, start],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("first", "second")
    ]
    published = {w.communicate(timeout=120)[0].strip() for w in writers}
    assert [w.returncode for w in writers] == [0, 0]
    assert published == {str(tmp_path / "entries" / KEY)}  # both see the one entry
    assert sorted(os.listdir(tmp_path / "entries")) == [KEY]  # no staging left behind
    entry = tmp_path / "entries" / KEY
    winner = (entry / "meta.json").read_text()
    assert winner in ("first", "second")
    assert (entry / "entry.bin").read_bytes() == winner.encode() * 2_000_000


def test_an_entry_being_written_is_not_found(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    staging = store.staging(KEY)
    (staging / "meta.json").write_text("{}")
    assert store.find(KEY) is None
    assert store.publish(staging, KEY) == tmp_path / "entries" / KEY
    assert store.find(KEY) == tmp_path / "entries" / KEY


def _age(path: Path, seconds: float) -> None:
    """Set ``path``'s times to ``seconds`` ago."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def _staging_of(store: JobStore, key: str, host: str, pid: int, start: int) -> Path:
    """A staging directory as writer ``pid`` (started at ``start``) on ``host`` names it."""
    path = store.entries / f".{key[:16]}.{host}.{pid}.{start}.x1y2z3_a"
    path.mkdir()
    (path / "entry.bin").write_bytes(b"half")
    return path


def _exited_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    return child.pid


def test_the_sweep_keeps_a_live_writers_directory_however_old(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    mine = store.staging(KEY)
    assert f".{this_host()}.{os.getpid()}.{process_start(os.getpid())}." in mine.name
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        theirs = _staging_of(
            store, "cd" * 32, this_host(), child.pid, process_start(child.pid) or 0
        )
        for path in (mine, theirs):
            _age(path, OTHER_HOST_STALE_SECONDS * 2)  # a paused build's days-old directory
        assert store.sweep() == []
        assert mine.exists() and theirs.exists()
        child.kill()
        child.wait(timeout=60)
        assert store.sweep() == [theirs.name]  # the writer is gone: at once
    finally:
        child.kill()
        child.wait(timeout=60)
    assert mine.exists()


def test_the_sweep_removes_a_dead_writers_directory_at_once(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    dead = _staging_of(store, KEY, this_host(), _exited_pid(), 1)
    no_such_pid = _staging_of(store, "cd" * 32, this_host(), 10**20, 1)  # os.kill overflows
    assert sorted(store.sweep()) == sorted([dead.name, no_such_pid.name])
    assert not dead.exists() and not no_such_pid.exists()


@pytest.mark.skipif(not hasattr(os, "waitid"), reason="os.waitid (WNOWAIT) is POSIX-only")
def test_the_sweep_removes_a_zombie_writers_directory(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_start(child.pid)
    if started is None:  # no /proc: a zombie cannot be told from a running process here
        child.wait(timeout=60)
        pytest.skip("no /proc")
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    try:
        zombie = _staging_of(store, KEY, this_host(), child.pid, started)
        assert store.sweep() == [zombie.name]
    finally:
        child.wait(timeout=60)


def test_the_sweep_removes_a_directory_whose_pid_now_names_another_process(tmp_path) -> None:
    store = JobStore(tmp_path)  # this pid runs, but not since the recorded start time
    started = process_start(os.getpid())
    if started is None:
        pytest.skip("no /proc: the start time of a process is not recorded here")
    reused = _staging_of(store, KEY, this_host(), os.getpid(), started + 1)
    assert store.sweep() == [reused.name]


def test_the_sweep_waits_a_day_for_another_hosts_writer(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    pid = _exited_pid()  # gone here, but on another host this pid says nothing
    recent = _staging_of(store, KEY, "other-host", pid, 1)
    old = _staging_of(store, "cd" * 32, "other-host", pid, 1)
    _age(recent, OTHER_HOST_STALE_SECONDS - 600)
    _age(old, OTHER_HOST_STALE_SECONDS + 600)
    assert store.sweep() == [old.name] and recent.exists()


def test_the_sweep_handles_the_older_staging_names(tmp_path: Path) -> None:
    """Before the start time was recorded: ``.<key16>.<host name>.<pid>.<random>``."""
    store = JobStore(tmp_path)
    host = this_host().split("-ns")[0]
    names = {
        "live": f".{KEY[:16]}.{host}.{os.getpid()}.abc123",
        "dead": f".{'cd' * 8}.{host}.{_exited_pid()}.abc123",
        "dead_recent": f".{'ef' * 8}.{host}.{_exited_pid()}.abc123",
        "other_host": f".{'01' * 8}.other-host.{os.getpid()}.abc123",
    }
    for label, name in names.items():
        (store.entries / name).mkdir()
        _age(store.entries / name, 600 if label == "dead_recent" else ASIDE_STALE_SECONDS + 600)
    assert store.sweep() == [names["dead"]]


def test_the_sweep_touches_only_names_it_writes(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    aside = store.entries / f".{KEY}.aside-1-abcd1234"
    foreign = [store.entries / ".user-notes", store.entries / "README", store.entries / ".a.b.1.c"]
    aside.mkdir()
    foreign[0].mkdir()
    foreign[1].write_text("mine")
    foreign[2].mkdir()
    for path in (aside, *foreign):
        _age(path, OTHER_HOST_STALE_SECONDS * 2)
    assert store.sweep() == [aside.name]
    assert all(p.exists() for p in foreign)


def test_a_discarded_entry_is_gone_and_can_be_published_again(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    staging = store.staging(KEY)
    (staging / "meta.json").write_text("bad")
    store.publish(staging, KEY)
    store.discard(KEY)
    assert store.find(KEY) is None and os.listdir(tmp_path / "entries") == []
    again = store.staging(KEY)
    (again / "meta.json").write_text("good")
    assert (store.publish(again, KEY) / "meta.json").read_text() == "good"


@pytest.mark.parametrize("key", ["../x", "AB" * 32, "ab" * 31, ""])
def test_a_key_that_is_not_a_hash_is_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(ArtifactError, match="is not a store key"):
        JobStore(tmp_path).find(key)
