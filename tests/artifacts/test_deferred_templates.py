"""Inductor's kernel templates parsed on first use while precompiled functions load
(``torchkiln.artifacts.deferred_templates``). The whole load path with inductor is in
test_precompile.py's slow test."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from torchkiln.artifacts.deferred_templates import DeferredTemplate

pytest.importorskip("jinja2")


def _torch_parse(source: str) -> object:
    from torch._inductor.codegen.common import KernelTemplate

    return KernelTemplate._template_from_string(source)


def test_a_deferred_template_parses_once_on_first_use_and_renders_as_torch_s() -> None:
    parsed: list[str] = []

    def counting(source: str) -> object:
        parsed.append(source)
        return _torch_parse(source)

    source = "{{ a }} + {{ b | indent_except_first(1) }}"
    template = DeferredTemplate(counting, source)
    assert parsed == []
    assert template.render(a=1, b="x\ny") == _torch_parse(source).render(a=1, b="x\ny")
    assert template.render(a=2, b="z") == "2 + z"
    assert parsed == [source]


def test_a_copy_without_init_does_not_recurse() -> None:
    import copy

    template = DeferredTemplate(_torch_parse, "{{ a }}")
    assert copy.copy(template).render(a=3) == "3"


IMPORT_WHILE_DEFERRED = textwrap.dedent(
    """
    import json, sys
    from torchkiln.artifacts.deferred_templates import DeferredTemplate, deferred_templates
    from torch._inductor.codegen.common import KernelTemplate
    original = KernelTemplate.__dict__["_template_from_string"]
    with deferred_templates():
        import torch._inductor.select_algorithm as select_algorithm
    templates = list(select_algorithm.TritonTemplate.all_templates.values())
    deferred = [t.template for t in templates if isinstance(t.template, DeferredTemplate)]
    unparsed = sum(1 for t in deferred if t._parsed is None)
    restored = KernelTemplate.__dict__["_template_from_string"] is original
    with deferred_templates():  # imported already: nothing to defer, nothing replaced
        inside = KernelTemplate.__dict__["_template_from_string"] is original
    source = deferred[0].parsed.environment is not None
    print(json.dumps({"templates": len(templates), "deferred": len(deferred),
                      "unparsed": unparsed, "restored": restored, "second_is_noop": inside,
                      "parses": source}))
    """
)


def test_templates_built_while_deferred_wait_and_the_parser_is_restored() -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_WHILE_DEFERRED],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["templates"] > 0
    assert result["deferred"] == result["templates"] == result["unparsed"]
    assert result["restored"] and result["second_is_noop"] and result["parses"]
