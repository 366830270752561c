"""docs/hooks.md documents every hook in core/plugin_host/hooks.py with its current signature, and every
hook has at least one test. (The page's examples run in test_plugin_docs.py.)"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from torchkiln.plugin import HOOK_NAMES
from torchkiln.plugin_host import hooks as hookspecs

ROOT = Path(__file__).resolve().parents[2]
HOOKS_PAGE = ROOT / "docs" / "hooks.md"
HOOKS = sorted(
    name
    for name, value in vars(hookspecs).items()
    if callable(value) and hasattr(value, f"{hookspecs.PROJECT_NAME}_spec")
)


def signature_of(name: str) -> str:
    """``def name(arg: Type, ...) -> Return`` as the spec declares it (annotations are strings
    under ``from __future__ import annotations``; shown without quotes)."""
    signature = inspect.signature(getattr(hookspecs, name))
    return f"def {name}{signature}".replace("'", "")


def is_firstresult(name: str) -> bool:
    return bool(getattr(getattr(hookspecs, name), f"{hookspecs.PROJECT_NAME}_spec")["firstresult"])


def sections() -> dict[str, str]:
    parts = re.split(r"^## (\S+)\s*$", HOOKS_PAGE.read_text(), flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_spec_module_has_the_nine_hooks():
    assert sorted([
        "declare_backends", "declare_selectors", "declare_distributed", "declare_layer_caches",
        "resolve_compile_config", "select_regions", "wrap_distributed", "prepare_group",
        "compile_region",
    ]) == HOOKS == sorted(HOOK_NAMES)  # fmt: skip


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented_with_its_current_signature(hook):
    section = sections().get(hook)
    assert section is not None, f"docs/hooks.md has no '## {hook}' section"
    documented = re.search(r"```python signature\n(.*?)\n```", section, re.DOTALL)
    assert documented is not None, f"'## {hook}' has no ```python signature block"
    assert documented[1].strip() == signature_of(hook)


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_doc_says_whether_it_is_firstresult(hook):
    section = sections()[hook]
    assert ("**firstresult**" in section) == is_firstresult(hook), section[:400]


def test_no_documented_hook_is_missing_from_the_spec():
    assert set(sections()) <= set(HOOKS)


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_test(hook):
    this_file = Path(__file__).resolve()
    testing = [
        path.relative_to(ROOT)
        for path in (ROOT / "tests").rglob("test_*.py")
        if path.resolve() != this_file and re.search(rf"\b{hook}\b", path.read_text())
    ]
    assert testing, f"no test under tests/ mentions the hook {hook!r}"
