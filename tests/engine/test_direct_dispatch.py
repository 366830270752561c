"""Direct dispatch (``dispatch="direct"``, opt-in; torch 2.13 and later): steady-state region calls skip
``torch.compile``'s wrapper, and every input that needs a recompile still gets one.

Each safety test changes one thing Dynamo guards on (shape, dtype, grad mode, input
``requires_grad``, a module attribute the graph reads) and checks three things: the output
equals eager, Dynamo compiled a new entry for the group, and the call after that is direct
again.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import torchkiln
import torchkiln.engine.dispatch
from torchkiln._internals.versions import feature_problem
from torchkiln.engine.compile_state import state_of
from torchkiln.errors import ConfigError

pytestmark = pytest.mark.skipif(
    feature_problem("dispatch 'direct'") is not None,
    reason=str(feature_problem("dispatch 'direct'")),
)


class ScaledBlock(nn.Module):
    """A block whose graph reads a plain float attribute (Dynamo guards on its value)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * torch.tanh(self.linear(x))


def blocks() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(ScaledBlock() for _ in range(3)))


def compiled_pair(**config):
    config.setdefault("dispatch", "direct")
    eager = blocks()
    model = torchkiln.compile(copy.deepcopy(eager), backend="eager", progress="off", **config)
    return eager, model


def dispatcher(model):
    (found,) = state_of(model).dispatchers.values()
    return found


def entries(model) -> int:
    return torch._C._dynamo.eval_frame._get_total_cache_entry_count(dispatcher(model).code)


def warm(model, x):
    with torch.no_grad():
        model(x)
        model(x)


def test_steady_calls_are_direct_and_equal_eager():
    eager, model = compiled_pair()
    x = torch.randn(2, 8)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(model(x), eager(x))
    # 9 block calls: the first compiles (through torch.compile), the other 8 are direct
    assert dispatcher(model).direct_calls == 8
    assert entries(model) == 1


class CountingCalls:
    """Wraps a function and counts its calls."""

    def __init__(self, function):
        self.function = function
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.function(*args, **kwargs)


def count_lean_calls(model) -> CountingCalls:
    found = dispatcher(model)
    ((code, lean),) = found.lean.items()
    counter = CountingCalls(lean)
    found.lean[code] = counter
    return counter


def test_steady_calls_run_the_lean_bytecode_without_torchs_disable_wrappers():
    eager, model = compiled_pair()
    x = torch.randn(2, 8)
    warm(model, x)
    found = dispatcher(model)
    ((code, lean),) = found.lean.items()
    ((_, compiled),) = found.entries
    assert code is compiled.__code__ is lean.__code__
    graph_fns = [name for name in lean.__globals__ if name.startswith("__compiled_fn")]
    assert graph_fns  # the graph's function, without torch._dynamo.disable's wrapper
    for name in graph_fns:
        assert not getattr(lean.__globals__[name], "_torchdynamo_disable", False)
        assert getattr(compiled.__globals__[name], "_torchdynamo_disable", False)
    counter = count_lean_calls(model)
    with torch.no_grad():
        torch.testing.assert_close(model(x), eager(x))
    assert counter.calls == 3


def test_with_an_eval_frame_callback_set_the_wrapped_bytecode_runs(monkeypatch):
    """Inside an outer compile's eager stretch Dynamo's callback is set; the disable wrappers
    are what keep it out of the graph's runtime code, so they stay."""
    eager, model = compiled_pair()
    x = torch.randn(2, 8)
    warm(model, x)
    counter = count_lean_calls(model)
    monkeypatch.setattr(torchkiln.engine.dispatch, "_EVAL_FRAME_CALLBACK", lambda: object())
    before = dispatcher(model).direct_calls
    with torch.no_grad():
        torch.testing.assert_close(model(x), eager(x))
    assert counter.calls == 0
    assert dispatcher(model).direct_calls == before + 3


@pytest.mark.parametrize("dispatch", ["direct", "reduced"])
@pytest.mark.parametrize(
    "change",
    ["shape", "dtype", "grad mode", "input requires_grad", "module attribute"],
)
def test_an_input_that_needs_a_recompile_gets_one(change, dispatch):
    eager, model = compiled_pair(dispatch=dispatch)
    x = torch.randn(2, 8)
    warm(model, x)
    direct_before, entries_before = dispatcher(model).direct_calls, entries(model)

    grad = False
    if change == "shape":
        x = torch.randn(5, 8)
    elif change == "dtype":
        eager.double()
        model.double()
        x = x.double()
    elif change == "grad mode":
        grad = True
    elif change == "input requires_grad":
        grad, x = True, x.clone().requires_grad_()
    else:
        eager[1].scale = model[1].scale = 3.0
    with torch.set_grad_enabled(grad):
        torch.testing.assert_close(model(x), eager(x))
        assert entries(model) > entries_before, "Dynamo did not recompile"
        model(x)  # the new entry is in the table now: this call is direct
    assert dispatcher(model).direct_calls > direct_before


def test_training_through_the_direct_path_matches_eager_gradients():
    eager, model = compiled_pair()
    x = torch.randn(2, 8)
    for _ in range(3):
        model.zero_grad()
        model(x).square().sum().backward()
    eager(x).square().sum().backward()
    assert dispatcher(model).direct_calls > 0
    for (name, mine), theirs in zip(model.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad, msg=name)


def test_a_stance_other_than_default_goes_through_torch_compile():
    eager, model = compiled_pair()
    x = torch.randn(2, 8)
    warm(model, x)
    before = dispatcher(model).direct_calls
    with torch.no_grad():
        with torch.compiler.set_stance("force_eager"):
            torch.testing.assert_close(model(x), eager(x))
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            torch.testing.assert_close(model(x), eager(x))
    assert dispatcher(model).direct_calls == before


def test_dynamo_reset_recompiles_instead_of_running_freed_code():
    eager, model = compiled_pair()
    x = torch.randn(2, 8)
    warm(model, x)
    torch._dynamo.reset()
    assert entries(model) == 0
    with torch.no_grad():
        torch.testing.assert_close(model(x), eager(x))
    assert entries(model) == 1


def test_a_group_with_a_graph_break_stays_on_torch_compile():
    class Breaking(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.linear(x)
            torch._dynamo.graph_break()
            return x.relu()

    torch.manual_seed(0)
    eager = nn.Sequential(Breaking(), Breaking())
    model = torchkiln.compile(
        copy.deepcopy(eager), backend="eager", progress="off", dispatch="direct"
    )
    x = torch.randn(2, 8)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(model(x), eager(x))
    assert dispatcher(model).usable is False
    assert dispatcher(model).direct_calls == 0


def test_a_group_compiled_with_compiled_autograd_on_keeps_torch_compiles_wrapper(capfd):
    """torch.compile's wrapper, built while compiled autograd is on, enables it around every
    call; direct dispatch would skip that, so the group keeps the wrapper (and says so)."""
    with torch._dynamo.config.patch(compiled_autograd=True):
        eager, model = compiled_pair()
    assert state_of(model).dispatchers == {}
    assert "torch._dynamo.config.compiled_autograd is on" in capfd.readouterr().err
    x = torch.randn(4, 8)
    warm(model, x)
    with torch.no_grad():
        torch.testing.assert_close(model(x), eager(x))


def test_dispatch_dynamo_installs_no_dispatcher_and_decompile_restores():
    _, model = compiled_pair(dispatch="dynamo")
    assert state_of(model).dispatchers == {}
    _, model = compiled_pair()
    warm(model, torch.randn(2, 8))
    torchkiln.decompile(model)
    assert all("forward" not in block.__dict__ for block in model)


def test_a_deep_copy_shares_the_dispatcher_and_runs_its_own_weights():
    eager, model = compiled_pair()
    x = torch.randn(2, 8)
    warm(model, x)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for block in twin:
            block.linear.weight.mul_(0.5)
        eager_twin = copy.deepcopy(eager)
        for block in eager_twin:
            block.linear.weight.mul_(0.5)
        torch.testing.assert_close(twin(x), eager_twin(x))
        torch.testing.assert_close(model(x), eager(x))


def test_reduced_checks_a_region_fully_once_then_with_the_reduced_set():
    eager, model = compiled_pair(dispatch="reduced")
    x = torch.randn(2, 8)
    warm(model, x)  # call 1 compiles; call 2 checks every guard and records each module
    assert len(dispatcher(model).verified) == 3
    snapshot = dispatcher(model).verified[model[0]]
    assert snapshot.unchanged()
    model[0].scale = float("1")  # an equal value, but the dict changed: checked fully again
    assert not snapshot.unchanged()
    with torch.no_grad():
        torch.testing.assert_close(model(x), eager(x))
    assert dispatcher(model).verified[model[0]] is not snapshot  # recorded again
    assert dispatcher(model).direct_calls == 5 + 3
    assert entries(model) == 1  # every guard passed: nothing to recompile


def test_an_unknown_dispatch_setting_is_refused_with_the_choices():
    with pytest.raises(
        ConfigError, match=r"'fast' is not a dispatch setting; allowed: direct, dynamo, reduced"
    ):
        torchkiln.compile(blocks(), backend="eager", dispatch="fast")


def test_generation_under_each_dispatch_equals_eager():
    """Prefill and decode compile different entries (the cache is empty, then filled): the
    first decode call must not run the prefill graph, under ``reduced`` either."""
    pytest.importorskip("transformers")
    from torchkiln.examples import example_inputs, llama

    base = llama(depth=3, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128)
    ids = example_inputs(base, 1, 12)
    expected = base.generate(ids, max_new_tokens=6, do_sample=False)
    for dispatch in ("direct", "reduced"):
        model = torchkiln.compile(
            copy.deepcopy(base), backend="eager", progress="off", dispatch=dispatch
        )
        for _ in range(2):
            assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), expected)
        assert dispatcher(model).direct_calls > 0
