"""Named causes: a guard or graph break that matches a known pattern, with its remedy.

Dynamo says *what* failed (``L['module'].drop_prob == 0.1``, ``Tensor.item()``); users need to
know *why* it happens with repeated blocks and what to change. Each :class:`ReportCause` is a
regular expression searched in a reason's one-line text (and Dynamo's full text), and a remedy.
Built-in causes are below; a plugin adds its own in its specs' ``report_causes``; first match
wins, plugins' before built-ins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import attrs


@attrs.frozen
class ReportCause:
    """A known cause of recompiles or graph breaks, recognised by a pattern."""

    name: str
    """Short name shown in the report (``.item() in a block``)."""
    pattern: str = attrs.field()
    """Regular expression searched (``re.search``) in the reason's text."""
    remedy: str
    """What to change, in one sentence."""
    kinds: tuple[str, ...] = ("guard", "graph break")
    """Which reasons it applies to: ``guard`` (recompiles, limit hits), ``graph break``."""

    @pattern.validator
    def _compiles(self, attribute: attrs.Attribute[str], value: str) -> None:
        try:
            re.compile(value)
        except re.error as error:
            raise ValueError(
                f"ReportCause {self.name!r}: bad pattern {value!r}: {error}"
            ) from error

    def matches(self, kind: str, text: str) -> bool:
        return kind in self.kinds and re.search(self.pattern, text) is not None


_MODULE_ATTRIBUTE = r"(?:L\['module'\]|\bmodule)(?:\.\w+|\._modules\['\w+'\])*"

BUILTIN_CAUSES: tuple[ReportCause, ...] = (
    ReportCause(
        "per-layer cache state",
        r"past_key_value|cache_position|key_cache|value_cache|\bcache\b.*\blayers\[|"
        r"DynamicCache|StaticCache|\._seen_tokens|\.layers\[\d+\]\.(keys|values)",
        "each block reads its own slot of the KV cache, so guards differ per layer: pass the "
        "cache as a tensor argument of fixed shape (a static cache), or mark its tensors with "
        "torch._dynamo.mark_static_address",
        ("guard",),
    ),
    ReportCause(
        "a None attribute",
        _MODULE_ATTRIBUTE + r"\.\w+ is (not )?None|" + _MODULE_ATTRIBUTE + r"[^\n]* is None\b|"
        r"expected type of '[^']*module[^']*' to be a tensor type.*NoneType|"
        r"module[^\s]*' to be .*but found <class 'NoneType'>",
        "an attribute that is None in some blocks and set in others gives each kind its own "
        "graph: give every block the same kind of value (an nn.Identity, a zero tensor)",
        ("guard",),
    ),
    ReportCause(
        "a specialised int/float attribute",
        _MODULE_ATTRIBUTE + r"\.\w+ == -?\d+(\.\d*)?(e-?\d+)?\b",
        "Dynamo compiles a plain int/float module attribute in as a constant (BEiT's drop_prob "
        "differs per block): store it as a tensor buffer, or keep it equal across blocks",
        ("guard",),
    ),
    ReportCause(
        "a ContextVar read inside a block",
        r"ContextVar",
        "Dynamo cannot trace contextvars: read the value before calling the block and pass it "
        "in as an argument",
        ("guard", "graph break"),
    ),
    ReportCause(
        ".item() in a block",
        r"\.item\(\)|Tensor\.item|_local_scalar_dense|capture_scalar_outputs",
        "a tensor turned into a Python number breaks the graph: keep it a tensor, or set "
        "torch._dynamo.config.capture_scalar_outputs = True",
        ("graph break",),
    ),
)


def match_cause(
    kind: str, texts: Iterable[str], causes: Sequence[ReportCause]
) -> ReportCause | None:
    """The first cause whose pattern is found in any of ``texts``."""
    texts = [t for t in texts if t]
    for cause in causes:
        if any(cause.matches(kind, text) for text in texts):
            return cause
    return None
