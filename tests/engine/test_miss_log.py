"""The miss log behind the report's ``missed N: reason`` lines."""

from __future__ import annotations

from torchkiln.engine.miss_log import DISTINCT, EXPLAINED, MissLog


def test_misses_are_counted_by_reason_and_the_rest_counted_only() -> None:
    log = MissLog()
    for index in range(EXPLAINED + 5):
        reason = f"size {index % 2}" if log.wants_reason() else None
        log.add(reason)
    assert log.total == EXPLAINED + 5
    assert log.reasons == {"size 0": EXPLAINED // 2, "size 1": EXPLAINED // 2}
    assert log.first == "size 0"
    assert log.lines(indent="") == [
        f"missed {EXPLAINED // 2}: size 0",
        f"missed {EXPLAINED // 2}: size 1",
        f"missed 5: not explained (after the first {EXPLAINED})",
    ]


def test_distinct_reasons_are_bounded() -> None:
    log = MissLog()
    for index in range(DISTINCT + 3):
        log.add(f"reason {index}")
    assert len(log.reasons) == DISTINCT + 1
    assert log.reasons["other reasons"] == 3
