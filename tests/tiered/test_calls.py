"""What the regional tier reads of the calls: when the log is ready to build, and whether a
later call is covered by what was built (else the one restart comes then)."""

from __future__ import annotations

import torch

from torchkiln.tiered.calls import CallLog, call_spec, covered, describe_families


class Root(torch.nn.Module):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return ids


def spec(length: int, *, grad: bool = True, batch: int = 2):
    model = Root().train(grad)
    with torch.set_grad_enabled(grad):
        return call_spec(model, (torch.zeros(batch, length, dtype=torch.long),), {})


def log_of(*specs) -> CallLog:
    log = CallLog()
    for item in specs:
        log.add(item, (), {})
    return log


def test_a_repeated_call_is_ready_with_sizes_fixed():
    log = log_of(spec(120), spec(120))
    assert log.ready()
    assert describe_families(log.families()) == "1 kind of call (training, sizes fixed)"


def test_a_second_call_with_other_sizes_is_evidence_enough():
    log = log_of(spec(120))
    assert not log.ready()
    log = log_of(spec(120), spec(96))
    assert log.ready()
    ((_, index, dims),) = log.families()
    assert index == 1 and dims == {"[0][0]": (1,)}  # args[0], the length dimension
    assert describe_families(log.families()) == "1 kind of call (training, dynamic sizes)"


def test_another_kind_of_call_is_not_yet_evidence_of_sizes():
    log = log_of(spec(120), spec(120, grad=False))
    assert not log.ready()  # two families of one call each: wait for more
    assert len(log.families()) == 2


def test_covered_by_a_static_build_only_at_its_sizes():
    built = log_of(spec(120), spec(120)).families()
    assert covered(spec(120), built)
    assert not covered(spec(96), built)  # the padding collator's third batch
    assert not covered(spec(120, grad=False), built)  # eval between training steps
    assert covered(spec(96), built, every_size_dynamic=True)  # compile(dynamic=True)


def test_covered_by_a_dynamic_build_in_the_dimension_that_varied_only():
    built = log_of(spec(120), spec(96)).families()
    assert covered(spec(128), built) and covered(spec(7), built)
    assert not covered(spec(120, batch=3), built)  # the batch dimension was fixed
