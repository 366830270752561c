"""``job.store``: many writers, nothing half-written visible, nothing foreign deleted."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchkiln.artifacts.directory import ArtifactError
from torchkiln.jobs.store import STALE_SECONDS, JobStore

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


def test_the_sweep_removes_only_what_a_killed_writer_left_an_hour_ago(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    old, fresh = store.staging(KEY), store.staging("cd" * 32)
    foreign = [tmp_path / "entries" / ".user-notes", tmp_path / "entries" / "README"]
    foreign[0].mkdir()
    foreign[1].write_text("mine")
    long_ago = time.time() - STALE_SECONDS - 60
    for path in (old, *foreign):
        os.utime(path, (long_ago, long_ago))
    assert store.sweep() == [old.name]
    assert not old.exists() and fresh.exists() and all(p.exists() for p in foreign)


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
