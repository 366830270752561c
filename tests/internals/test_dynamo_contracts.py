"""Contracts of ``torchkiln._internals.dynamo``: each adapter function works on this torch.

One test per function; a torch release that renames or changes what one reads fails here, with
the function's name. Small functions and ``backend="eager"`` only.
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn

from torchkiln._internals import dynamo

pytestmark = pytest.mark.usefixtures("reset_dynamo")  # counts and compiled code of its own


def test_eval_frame_stance() -> None:
    assert dynamo.eval_frame_stance().stance == "default"
    with torch.compiler.set_stance("force_eager"):
        assert dynamo.eval_frame_stance().stance == "force_eager"
    assert dynamo.eval_frame_stance().stance == "default"


def test_stance_name() -> None:
    assert dynamo.stance_name() == "default"
    with torch.compiler.set_stance("eager_on_recompile"):
        assert dynamo.stance_name() == "eager_on_recompile"


def test_optimized_module_type() -> None:
    compiled = torch.compile(nn.Linear(2, 2), backend="eager")
    assert issubclass(dynamo.optimized_module_type(), nn.Module)
    assert type(compiled) is dynamo.optimized_module_type()


def test_original_module() -> None:
    plain = nn.Linear(2, 2)
    assert dynamo.original_module(torch.compile(plain, backend="eager")) is plain


def test_rewrapped() -> None:
    optimized = torch.compile(nn.Linear(2, 2), backend="eager")
    other = nn.Linear(2, 2)
    again = dynamo.rewrapped(other, optimized)
    assert type(again) is dynamo.optimized_module_type()
    assert dynamo.original_module(again) is other
    x = torch.randn(3, 2)
    torch.testing.assert_close(again(x), other(x))
    assert dynamo.counters()["stats"]["unique_graphs"] == 1


def test_without_wrapper_keys() -> None:
    plain = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)))
    wrapped = nn.Sequential(
        torch.compile(plain[0], backend="eager"), nn.Sequential(torch.compile(plain[1][0]))
    )
    keys = list(wrapped.state_dict())
    assert any("_orig_mod" in key for key in keys)  # what the wrapper adds
    assert [dynamo.without_wrapper_keys(key) for key in keys] == list(plain.state_dict())


def test_lookup_backend() -> None:
    backend = dynamo.lookup_backend("eager")
    assert callable(backend)
    compiled = torch.compile(lambda x: x * 2, backend=backend)
    torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), 2.0))


def test_counters() -> None:
    found = dynamo.counters()
    assert isinstance(found["graph_break"], collections.Counter)
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    assert found["stats"]["unique_graphs"] == 1


def test_compilation_metrics() -> None:
    def adapter_contract_frame(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    before = len(dynamo.compilation_metrics())
    torch.compile(adapter_contract_frame, backend="eager")(torch.ones(2))
    metrics = dynamo.compilation_metrics()
    assert isinstance(metrics, list)
    assert len(metrics) > before or before == len(metrics) > 0  # Dynamo keeps the newest only
    last = metrics[-1]
    assert last.co_name == "adapter_contract_frame"
    assert isinstance(last.entire_frame_compile_time_s, float)
    assert hasattr(last, "recompile_reason") and hasattr(last, "fail_reason")


def test_exception_type() -> None:
    def breaks(x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return x + 1

    assert issubclass(dynamo.exception_type(), BaseException)
    with pytest.raises(dynamo.exception_type()):
        torch.compile(breaks, backend="eager", fullgraph=True)(torch.ones(2))


def test_config() -> None:
    config = dynamo.config()
    settings = config.get_config_copy()
    assert isinstance(settings, dict)
    assert "allow_unspec_int_on_nn_module" in settings
    assert config.allow_unspec_int_on_nn_module is settings["allow_unspec_int_on_nn_module"]


def test_config_patch() -> None:
    before = dynamo.config().allow_unspec_int_on_nn_module
    with dynamo.config_patch(allow_unspec_int_on_nn_module=not before):
        assert dynamo.config().allow_unspec_int_on_nn_module is (not before)
    assert dynamo.config().allow_unspec_int_on_nn_module is before


def test_floats_specialized() -> None:
    before = dynamo.config().specialize_float
    with dynamo.floats_specialized():
        assert dynamo.config().specialize_float is True
    assert dynamo.config().specialize_float is before


def test_traced_config_patcher() -> None:
    """Used inside a traced function: no graph break, and process-wide settings unchanged."""
    patcher = dynamo.traced_config_patcher()
    before = dynamo.config().allow_unspec_int_on_nn_module

    def patched(x: torch.Tensor) -> torch.Tensor:
        with patcher(allow_unspec_int_on_nn_module=True):
            return x + 1

    out = torch.compile(patched, backend="eager", fullgraph=True)(torch.ones(2))
    torch.testing.assert_close(out, torch.full((2,), 2.0))
    assert dynamo.config().allow_unspec_int_on_nn_module is before
    with pytest.raises(ValueError):  # what torchkiln's probe for a missing setting relies on
        patcher(no_such_setting_anywhere=True)


_TRACED: list[str] = []


def _traced_outside(ctx: object) -> None:
    _TRACED.append("outside")


def _traced_inside(ctx: object) -> None:
    _TRACED.append("inside")


def _fallback() -> None:
    _TRACED.append("fallback")


def test_comptime_function() -> None:
    """Runs at trace time only, fetched outside or inside the traced function (a comptime
    function has no free variables); eagerly, the fallback runs."""
    comptime = dynamo.comptime_function()
    _TRACED.clear()

    def noted(x: torch.Tensor) -> torch.Tensor:
        comptime(_traced_outside)
        dynamo.comptime_function()(_traced_inside, _fallback)
        return x + 1

    compiled = torch.compile(noted, backend="eager", fullgraph=True)
    compiled(torch.ones(2))
    compiled(torch.ones(2))
    assert _TRACED == ["outside", "inside"]  # once: the second call runs the compiled code
    comptime(_traced_inside, _fallback)
    assert _TRACED[-1] == "fallback"


def test_has_static_address_tag() -> None:
    model = nn.Linear(2, 2)
    assert not dynamo.has_static_address_tag(model.weight)
    torch.compile(model, backend="eager")(torch.ones(1, 2))
    assert dynamo.has_static_address_tag(model.weight)  # Dynamo tags the parameters it sees
    marked = torch.zeros(2)
    torch._dynamo.mark_static_address(marked, guard=False)
    assert dynamo.has_static_address_tag(marked)


def test_drop_static_address_tag() -> None:
    marked = torch.zeros(2)
    torch._dynamo.mark_static_address(marked, guard=False)
    dynamo.drop_static_address_tag(marked)
    assert not dynamo.has_static_address_tag(marked)
    dynamo.drop_static_address_tag(marked)  # no tag: no change


def test_recompile_refusal_is_told_from_other_errors_and_names_the_guard():
    import torch

    from torchkiln._internals.dynamo import recompile_refusal

    compiled = torch.compile(lambda x: x * 2, backend="eager")
    compiled(torch.ones(2))
    with torch.compiler.set_stance("fail_on_recompile"), pytest.raises(RuntimeError) as caught:
        compiled(torch.ones(3, 3))
    guards = recompile_refusal(caught.value)
    assert guards is not None and len(guards) == 1
    assert "rank mismatch" in guards[0] and "expected 1, actual 2" in guards[0]
    assert recompile_refusal(RuntimeError("a user's own error")) is None
    assert recompile_refusal(ValueError(str(caught.value))) is None
