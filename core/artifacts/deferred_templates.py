"""Inductor's kernel templates, parsed on first use rather than at import, while precompiled
functions load.

The Python module of every function inductor compiled imports
``torch._inductor.select_algorithm`` (for ``extern_kernels``, the matrix-product calls), and
importing it builds every kernel template inductor ships, each parsing its Jinja source right
away (``KernelTemplate._template_from_string``): the largest single part of loading a
precompiled inductor function. A loaded function renders none of them: templates are rendered
only while inductor compiles (autotuning). So while torchkiln loads precompiled functions,
:func:`deferred_templates` makes that parser return a :class:`DeferredTemplate`, which parses
its source with torch's own function the first time anything of the template is used.
docs/precompile.md ("Where a precompiled first call's time goes") gives what it saves.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

from torchkiln._internals import inductor


class DeferredTemplate:
    """A Jinja template parsed on first use by ``parse(source)`` (torch's own parser)."""

    __slots__ = ("_parse", "_parsed", "_source")

    def __init__(self, parse: Callable[[str], Any], source: str):
        self._parse = parse
        self._source = source
        self._parsed: Any = None

    @property
    def parsed(self) -> Any:
        if self._parsed is None:
            self._parsed = self._parse(self._source)
        return self._parsed

    def __getattr__(self, name: str) -> Any:
        if name in _OWN or name.startswith("__"):  # unset (a copy before its state is set)
            raise AttributeError(name)
        return getattr(self.parsed, name)


_OWN = frozenset({*DeferredTemplate.__slots__, "parsed"})


@contextlib.contextmanager
def deferred_templates() -> Iterator[None]:
    """Inductor templates created inside this context are parsed on first use.

    Only if ``select_algorithm`` has not been imported yet. The templates created inside stay
    deferred for the process; the ones created later, and ``_template_from_string`` itself,
    are as torch made them. Without Jinja, or with a torch whose ``KernelTemplate`` lacks the
    function, nothing is replaced.
    """
    if inductor.templates_built() or importlib.util.find_spec("jinja2") is None:
        yield  # already built (nothing to save), or torch keeps its templates as None
        return
    original = inductor.template_parser()
    if not isinstance(original, staticmethod):  # another torch: leave it alone
        yield
        return
    deferred = functools.partial(DeferredTemplate, original.__func__)  # parse(source) on first use
    inductor.set_template_parser(staticmethod(deferred))
    try:
        yield
    finally:
        inductor.set_template_parser(original)
