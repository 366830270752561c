"""The exchange outside a job (a world of one), and what a waiting rank says while it waits."""

from __future__ import annotations

import time

import pytest

from torchkiln.jobs import exchange
from torchkiln.jobs.exchange import JobExchange


def test_a_world_of_one_exchanges_with_itself() -> None:
    alone = JobExchange(timeout=5, progress=False)
    assert (alone.rank, alone.world, alone.group) == (0, 1, None)
    assert alone.gather({"key": "k"}, "group 'g'") == [{"key": "k"}]
    assert alone.broadcast_object({"entry": b"x"}, 0, "group 'g'") == {"entry": b"x"}


def test_a_rank_blocked_in_the_barrier_says_what_it_waits_for(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(exchange, "NOTE_EVERY_SECONDS", 0.05)
    waiting = JobExchange(timeout=5, progress=True)
    started = time.monotonic()
    with waiting._noting("waiting for every rank to reach group 'g'", started):
        time.sleep(0.18)
    notes = capsys.readouterr().err.splitlines()
    assert 2 <= len(notes) <= 4
    assert all(
        n.startswith("torchkiln: rank 0: waiting for every rank to reach group 'g' (")
        for n in notes
    )
    time.sleep(0.1)  # the notes stop with the block
    assert capsys.readouterr().err == ""
