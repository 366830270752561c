"""The calls a compiled form did not fit, counted by the first guard that failed (the report's
"missed" lines, per group and for the whole-model form)."""

from __future__ import annotations

import attrs

EXPLAINED = 16
"""Misses explained one by one (torch's ``check_verbose`` on each of the form's functions);
later ones are counted only, so a form that keeps missing costs its calls nothing more."""
DISTINCT = 8
"""Distinct reasons kept; others are counted under ``other reasons``."""


@attrs.define
class MissLog:
    """Every miss counted; the first :data:`EXPLAINED` by their reason."""

    total: int = 0
    reasons: dict[str, int] = attrs.Factory(dict)

    def wants_reason(self) -> bool:
        """Whether the next miss should be explained (before :meth:`add`)."""
        return self.total < EXPLAINED

    def add(self, reason: str | None) -> None:
        self.total += 1
        if reason is None:
            return
        key = reason if reason in self.reasons or len(self.reasons) < DISTINCT else "other reasons"
        self.reasons[key] = self.reasons.get(key, 0) + 1

    @property
    def first(self) -> str | None:
        return next(iter(self.reasons), None)

    def lines(self, indent: str = "    ") -> list[str]:
        """``missed N: reason`` per reason, and the misses not explained."""
        out = [f"{indent}missed {count}: {reason}" for reason, count in self.reasons.items()]
        unexplained = self.total - sum(self.reasons.values())
        if unexplained:
            out.append(f"{indent}missed {unexplained}: not explained (after the first {EXPLAINED})")
        return out
