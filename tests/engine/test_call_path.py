"""What of torchkiln runs in a compiled block's later call (design principle 6: after the first
call, at most one small torchkiln frame in front of compiled code; no work the first call could
have done once). Pinned as the set of distinct torchkiln functions a model call enters, counted
with ``sys.setprofile``, so that the forward path cannot grow back unnoticed (issue 41)."""

from __future__ import annotations

import collections
import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

import torchkiln
import torchkiln.plugins
from torchkiln.examples import llama

ROOTS = tuple(os.path.dirname(m.__file__ or "") + os.sep for m in (torchkiln, torchkiln.plugins))

LATER_CALL_LIMIT = 10
"""Distinct torchkiln functions a later call of a 3-block Llama may enter (8 when written:
the region's runtime, the transformers adapter's call, its layer view and the view's
``__init__``, the output collector's call, the trace settings and their context, the group's
compiled function)."""

FIRST_CALL_LIMIT = 21
"""Distinct torchkiln functions the first call of a second 3-block Llama may enter, once a first
model built the view classes, as in a process that compiles twice: 21, one over issue 41's
target of 20 (counted by qualified name since 2026-12-05: before, ``RegionRuntime.__call__`` and
``FirstCall.__call__`` counted as one, and the pin said 20)."""


def torchkiln_functions(fn: Callable[[], Any]) -> collections.Counter[str]:
    """``(file, qualified function name) -> calls`` for every torchkiln function ``fn`` enters
    (by qualified name: two classes' ``__call__`` in one file are two functions)."""
    seen: collections.Counter[str] = collections.Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(ROOTS):
            seen[f"{os.path.basename(code.co_filename)}:{code.co_qualname}"] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def test_a_later_block_call_enters_few_torchkiln_functions() -> None:
    model = llama(depth=3)
    torchkiln.compile(model, backend="eager", progress="off")
    tokens = torch.randint(0, 100, (1, 8))
    with torch.no_grad():
        model(tokens)  # the first call compiles
        later = torchkiln_functions(lambda: model(tokens))
    assert len(later) <= LATER_CALL_LIMIT, sorted(later.items())
    # Every block ran its compiled code, once per call: nothing fell back to eager.
    compiled = [name for name in later if ":torchkiln_LlamaDecoderLayer" in name]
    assert len(compiled) == 1 and later[compiled[0]] == 3, sorted(later.items())


def test_a_first_block_call_enters_few_torchkiln_functions() -> None:
    tokens = torch.randint(0, 100, (1, 8))
    warm = llama(depth=3)
    torchkiln.compile(warm, backend="eager", progress="off")
    model = llama(depth=3)
    torchkiln.compile(model, backend="eager", progress="off")
    with torch.no_grad():
        warm(tokens)
        first = torchkiln_functions(lambda: model(tokens))
    assert len(first) <= FIRST_CALL_LIMIT, sorted(first.items())
    assert [r.status for r in torchkiln.report(model).regions] == ["compiled"] * 3
