"""What a rank traced for a group: the check that one rank may run code another compiled.

A group's key (:mod:`torchkiln.jobs.keys`) holds what the code is traced *from*: the sources,
the layout, the blocks' plain attributes. It cannot hold what Dynamo reads while it traces and
bakes into the graph without a saved guard: ``torch.distributed.get_rank()`` is folded into a
constant, and ``aot_compile`` drops the guards on globals (pytorch#191878, #189330). So, in a job
of several ranks, every rank traces the group's first call itself (Dynamo only, nothing is
compiled: the backend sees the graph and stops) and sends a digest of the graph with its key.
A rank whose digest differs from its source's compiles its own, and the report names the first
line that differs.

What the digest covers: the graph's code (its operations, and every Python number or string
Dynamo baked in as a constant) and the values of the tensor constants it holds. What it leaves to
the saved guards: whatever they check when a rank loads the entry (the inputs' shapes and
dtypes, the module attributes Dynamo guarded on); a call they reject is compiled on that rank.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Any

import attrs
import torch
from torch import fx

from torchkiln.artifacts.directory import error_reason
from torchkiln.engine.dynamo_records import traced_only
from torchkiln.engine.group_runtime import GroupCall, trace_settings_of
from torchkiln.jobs.entry import plain_module


@attrs.frozen
class TracedGraph:
    """The graph Dynamo traced for a group's first call on this rank, as its code; or why it
    could not be traced whole (``failure``: then ``code`` and ``digest`` are empty)."""

    code: str
    digest: str
    failure: str | None = None

    def packed(self) -> bytes:
        """The code, compressed, for the gather (a block's graph is a few KB of text)."""
        return zlib.compress(self.code.encode(), 6)


class _Captured(Exception):
    """Raised by the capturing backend once it holds the graph: nothing is compiled."""

    def __init__(self, graph: fx.GraphModule):
        super().__init__("graph captured")
        self.graph = graph


def _capture(graph: fx.GraphModule, example_inputs: list[Any]) -> Any:
    raise _Captured(graph)


def trace_group(call: GroupCall, dynamic: bool | None) -> TracedGraph:
    """The graph of ``call`` (the group's first call on this rank), traced the way its entry is
    compiled (``fullgraph``, the group's trace settings, the module without torchkiln's state);
    when Dynamo cannot trace it whole, why (the entry's compile then fails the same way, and
    every rank compiles its own). Nothing is compiled, and the report counts no graph for it
    (:func:`~torchkiln.engine.dynamo_records.traced_only`)."""
    traced: Any = torch.compile(call.shared, backend=_capture, fullgraph=True, dynamic=dynamic)
    try:
        with traced_only(), plain_module(call.module), trace_settings_of(call.build_savable()):
            traced.aot_compile(((call.module, *call.args), call.kwargs))
    except _Captured as captured:
        return graph_of(captured.graph)
    except Exception as error:  # a graph break, or what the savable compile would refuse too
        return TracedGraph("", "", failure=error_reason(error))
    return TracedGraph("", "", failure="the backend was never given a graph")


def graph_of(graph: fx.GraphModule) -> TracedGraph:
    """The graph's code and its digest: the code, then each tensor constant's name, dtype,
    shape and bytes."""
    code = graph.code.strip()
    digest = hashlib.sha256(code.encode())
    for name, value in sorted(_constants(graph).items()):
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        digest.update(value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return TracedGraph(code, digest.hexdigest())


def _constants(graph: fx.GraphModule) -> dict[str, torch.Tensor]:
    """The tensors the graph reads with ``get_attr`` (constants Dynamo lifted into it)."""
    found = {}
    for node in graph.graph.nodes:
        if node.op == "get_attr":
            value = getattr(graph, str(node.target), None)
            if isinstance(value, torch.Tensor):
                found[str(node.target)] = value
    return found


def first_difference(mine: TracedGraph, theirs: bytes, source: int) -> str:
    """``line 12: `mul = ... * 1.01` here, `mul = ... * 1.0` on rank 0``: the first line of
    the graph's code that differs from the source rank's (``theirs``: its packed code)."""
    if mine.failure is not None:
        return f"this rank could not trace it whole: {mine.failure}"
    other = zlib.decompress(theirs).decode().splitlines()
    if not other:
        return f"rank {source} could not trace it whole"
    lines = mine.code.splitlines()
    for number, (a, b) in enumerate(zip(lines, other, strict=False), start=1):
        if a != b:
            start = _first_column(a, b)
            return (
                f"line {number}: `{_around(a, start)}` here, `{_around(b, start)}` on rank {source}"
            )
    if len(lines) != len(other):
        return f"{len(lines)} lines here, {len(other)} on rank {source}"
    return f"a tensor constant's value differs from rank {source}'s"


def _first_column(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _around(line: str, column: int, width: int = 60) -> str:
    """Up to ``width`` characters of ``line`` from a little before ``column`` (where it differs)."""
    begin = max(0, column - 20)
    text = line[begin : begin + width].strip()
    return ("..." if begin else "") + text + ("..." if begin + width < len(line) else "")
