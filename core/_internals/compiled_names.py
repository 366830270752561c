"""The name Dynamo gives a compiled graph's function, made the same on every rank of a job for one
``aot_compile`` (sharing through torch's caches, :mod:`torchkiln.jobs.share`).

``aot_compile`` keys torch's AOTAutograd cache entry by the graph *and* the compiled function's
name (``AOTConfig.precompile_backend_id``, in the key since torch 2.13), and Dynamo makes that
name unique with a random UUID (``__compiled_fn_<n>_<uuid4>``): two processes compiling the same
graph never find each other's entry. Under :func:`stable_compiled_fn_name` the name is derived
from a seed (the group's share key) instead, so a rank that holds another rank's entry hits it:
Dynamo traces, AOTAutograd and inductor load, nothing is lowered or compiled again.

Dynamo installs the name in the traced function's globals while the compiled code lives, and
refuses a name already there (``AssertionError: Name ... already exists in scope``). So a seed's
second use in one process (the same group compiled again, another copy of the model) gets a name
of its own, numbered; ranks compile in the same order, so their numbers agree, and a restarted
process starts again from the first.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

PREFIX = "__compiled_fn"
_uses: dict[str, int] = {}
"""Seed -> how many times this process named a compiled function after it."""


def _name(seed: str) -> str:
    digest = hashlib.sha256(seed.encode()).hexdigest()
    # the form torch 2.15 checks (``__compiled_fn_<n>_<uuid with underscores>``)
    parts = (digest[:8], digest[8:12], digest[12:16], digest[16:20], digest[20:32])
    return f"{PREFIX}_0_{'_'.join(parts)}"


@contextlib.contextmanager
def stable_compiled_fn_name(seed: str) -> Iterator[bool]:
    """While the block runs (one ``aot_compile`` on this thread), the compiled graph's function
    is named after ``seed``; yields whether this torch could be told (``False``: the random name
    stays, and the ranks' AOTAutograd keys differ).

    Replaces the name maker ``torch._dynamo.output_graph`` calls: ``make_compiled_fn_name``
    (torch 2.15) or ``unique_id("__compiled_fn", with_uuid=True)`` (torch 2.13); no public API
    names the function. Verified: torch 2.13, 2.15.
    """
    from torch._dynamo import output_graph

    used = _uses.get(seed, 0)
    _uses[seed] = used + 1
    name = _name(seed if not used else f"{seed}#{used}")
    if hasattr(output_graph, "make_compiled_fn_name"):
        attribute, original = "make_compiled_fn_name", output_graph.make_compiled_fn_name

        def replacement(*args: Any, **kwargs: Any) -> str:
            return name

    elif hasattr(output_graph, "unique_id"):
        attribute, original = "unique_id", output_graph.unique_id

        def replacement(*args: Any, **kwargs: Any) -> str:
            if args and args[0] == PREFIX and kwargs.get("with_uuid"):
                return name
            return original(*args, **kwargs)

    else:
        yield False
        return
    setattr(output_graph, attribute, replacement)
    try:
        yield True
    finally:
        setattr(output_graph, attribute, original)
