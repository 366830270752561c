"""The one vocabulary of what serves a call (docs/architecture.md, "States").

A region, its group's code, the root's whole-model form and a rank's group in a job each have a
:class:`State` from this list, kept by the runtime as calls run; ``torchkiln.report``,
``torchkiln.tiered.tiers`` and the docs print these words and no others. Where code came from
(the store, a peer rank, an artifact directory, the builder) is the *source*, said beside the
state ("serving from rank 0"), never a state of its own.
"""

from __future__ import annotations

import enum


class State(enum.StrEnum):
    """What serves the calls of a region, a group or the root.

    A ``StrEnum``: each member equals its word, so reports and their JSON keep plain strings.
    """

    PENDING = "pending"
    """Nothing serves yet: no first call finished (a region, a group), or the whole-model form
    is not there yet (the root, observing or building)."""
    SERVING = "serving"
    """Code that a source had serves the calls it fits: saved functions from the store, a peer
    rank or an artifact directory, or the builder's whole-model form. A call none fits runs the
    next way (the backend's code for a group, the regions for the root)."""
    COMPILED = "compiled"
    """The backend compiled it in this process, at its first call."""
    EAGER = "eager"
    """Its own forward runs uncompiled: a region whose compile failed (``on_region_error:
    eager``), or the root with no whole-model form (each block still runs its group's code)."""
    FAILED = "failed"
    """Its compile raised (``on_region_error: raise``); the next call tries again."""


def describe(state: str, source: str | None) -> str:
    """``serving from rank 0``; the state alone where no source served."""
    return f"{state} from {source}" if state == State.SERVING and source else str(state)
