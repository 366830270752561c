"""A store serves one process too: a restarted process (here: a second compile) loads what the
first compiled. And the decisions: when a job shares, when not, and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import torchkiln
from torchkiln._internals import dynamo
from torchkiln.artifacts.directory import read_meta
from torchkiln.configuration.config import CompileConfig, DistributedConfig, JobConfig
from torchkiln.examples import llama
from torchkiln.jobs import job_share_for, sharded_after_compile, share_way, sharing_problem
from torchkiln.jobs.keys import describe_difference, differing_fields, share_fields, share_key
from torchkiln.jobs.share import GroupShare
from torchkiln.jobs.store import JobStore
from torchkiln.plugin import GroupPreparation

SHAPE = {"depth": 2, "hidden_size": 32, "heads": 4, "kv_heads": 2, "intermediate_size": 64,
         "vocab_size": 128}  # fmt: skip


def graphs() -> int:
    return int(dynamo.counters()["stats"]["unique_graphs"])


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_second_compile_loads_the_group_from_the_store(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = llama(**SHAPE).eval()
    ids = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        expected = model(ids).logits
    store = str(tmp_path / "store")
    torchkiln.compile(model, backend="aot_eager", job={"store": store}, progress="off")
    with torch.no_grad():
        first = model(ids).logits
    [group] = torchkiln.report(model).job.groups
    assert (group.role, group.stored, group.compile_seconds > 0) == ("compiled", True, True)
    torchkiln.decompile(model)
    before = graphs()
    torchkiln.compile(model, backend="aot_eager", job={"store": store}, progress="off")
    with torch.no_grad():
        again = model(ids).logits
    [group] = torchkiln.report(model).job.groups
    assert (group.role, group.compile_seconds, graphs() - before) == ("store", 0.0, 0)
    assert torch.allclose(first, expected, atol=1e-6) and torch.allclose(again, expected, atol=1e-6)
    lines = torchkiln.report(model).job.lines()
    assert lines[0] == f"job: rank 0 of 1, compiled once per job, store {tmp_path / 'store'}"
    assert lines[1].startswith(
        "  LlamaDecoderLayer: serving from store, shared as a saved function (compile 0.0 s"
    )


def test_one_process_without_a_store_is_not_a_job() -> None:
    plan = torchkiln.plan(llama(**SHAPE))
    pm = torchkiln.get_plugin_manager()
    assert job_share_for(CompileConfig(), plan, pm, progress=False) == (None, None)


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (CompileConfig(job=JobConfig(share="off")), "job.share is off"),
        (CompileConfig(artifacts="/x"), "artifacts= serves the groups"),
        pytest.param(
            CompileConfig(backend="eager"),
            "backend 'eager' does not declare that its compiled",
            marks=pytest.mark.needs_feature("precompiled artifacts"),
        ),
        pytest.param(
            CompileConfig(distributed=DistributedConfig(strategy="tp")),
            "distributed strategy 'tp': compiled groups are shared under none, ddp, deepspeed, "
            "fsdp2 only",
            marks=pytest.mark.needs_feature("precompiled artifacts"),
        ),
    ],
)
def test_why_a_job_does_not_share(config: CompileConfig, problem: str) -> None:
    plan = torchkiln.plan(llama(**SHAPE))
    found = sharing_problem(config, plan, torchkiln.get_plugin_manager())
    assert found is not None and found.startswith(problem)


@pytest.mark.needs_feature("precompiled artifacts")
def test_fsdp2_shares_saved_functions_a_model_sharded_after_compiling_its_caches() -> None:
    """Under torchkiln's FSDP2 (HSDP included) groups are shared as saved functions (the load
    keeps each block's fully_shard class); a model its caller shards after compiling
    (Accelerate's FSDP2) through torch's caches. The report's line says which way."""
    plan = torchkiln.plan(llama(**SHAPE))
    pm = torchkiln.get_plugin_manager()
    fsdp2 = CompileConfig(distributed=DistributedConfig(strategy="fsdp2"))
    assert sharing_problem(fsdp2, plan, pm) is None
    assert (share_way(fsdp2), share_way(CompileConfig())) == ("function", "function")
    with sharded_after_compile("fsdp2"):
        assert share_way(CompileConfig()) == "caches"
    received = GroupShare("LlamaDecoderLayer", role="received", via="caches", source=0, key="k")
    assert received.line().startswith(
        "LlamaDecoderLayer: serving from rank 0, shared through torch's caches (compile 0.0 s"
    )
    local = GroupShare("LlamaDecoderLayer", via="caches", key="k", reason="why")
    assert local.line().startswith("LlamaDecoderLayer: compiled (compile")
    assert (received.state, local.state) == ("serving", "compiled")


def test_share_on_refuses_a_job_that_cannot_share(tmp_path: Path) -> None:
    with pytest.raises(torchkiln.JobError, match=r"job\.share is on, but this job cannot share"):
        torchkiln.compile(
            llama(**SHAPE), backend="eager", job={"share": "on", "store": str(tmp_path)}
        )


def forward(module: torch.nn.Module, *args: object, **kwargs: object) -> object:
    """A group function traced through no wrapper (the block's forward alone)."""
    return type(module).forward(module, *args, **kwargs)


def test_the_key_names_every_field_that_differs() -> None:
    model = llama(**SHAPE)
    layer = model.model.layers[0]
    hidden = torch.randn(1, 8, 32)
    base = share_fields(CompileConfig(), "g", layer, forward, (hidden,), {})
    other_mode = share_fields(
        CompileConfig(mode="max-autotune"), "g", layer, forward, (hidden,), {}
    )
    longer = share_fields(CompileConfig(), "g", layer, forward, (torch.randn(1, 9, 32),), {})
    assert share_key(base) == share_key(dict(base)) and len(share_key(base)) == 64
    assert differing_fields(other_mode, base) == ["mode"]
    assert differing_fields(longer, base) == ["inputs"]
    with torch.no_grad():
        assert (
            share_fields(CompileConfig(), "g", layer, forward, (hidden,), {})["kind"] == "inference"
        )


def test_ranks_on_other_device_indices_key_apart_and_the_reason_says_why() -> None:
    """Compiled code is bound to its device index (Dynamo's tensor guards compare it; inductor's
    code enters that device), so cuda:0's entry never fits cuda:1: the key has the index, and
    the reason names it. (Fields as two ranks of one 8-GPU node would compute them.)"""
    layer = llama(**SHAPE).model.layers[0]
    here = share_fields(CompileConfig(), "g", layer, forward, (torch.randn(1, 8, 32),), {})
    assert here["device_index"] is None  # the CPU has no index
    cuda0, cuda1 = {**here, "device_index": 0}, {**here, "device_index": 1}
    assert share_key(cuda0) != share_key(cuda1)
    assert describe_difference(cuda1, cuda0) == (
        "this rank's key differs from rank 0's in: device_index (device index 1 here, 0 on "
        "rank 0: compiled code is bound to its device index, so the entry cannot fit)"
    )


@pytest.mark.parametrize("share", ["auto", "on"])
def test_a_torch_without_aot_compile_names_itself(share: str) -> None:
    from torchkiln._internals.versions import feature_problem

    missing = feature_problem("precompiled artifacts")
    if missing is None:
        pytest.skip("this torch has aot_compile: the refusal is for torch before 2.13")
    plan = torchkiln.plan(llama(**SHAPE))
    config = CompileConfig(job=JobConfig(share=share, store="/tmp/kiln-store-unused"))
    assert sharing_problem(config, plan, torchkiln.get_plugin_manager()) == missing
    if share == "on":
        with pytest.raises(torchkiln.JobError, match="torch"):
            job_share_for(config, plan, torchkiln.get_plugin_manager(), progress=False)
    else:
        share_, report = job_share_for(config, plan, torchkiln.get_plugin_manager(), False)
        assert share_ is None and report.lines() == [
            f"job: rank 0 of 1, every rank compiles: {missing}"
        ]


@pytest.mark.needs_feature("precompiled artifacts")
def test_the_report_counts_calls_the_entry_did_not_fit(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = llama(**SHAPE).eval()
    torchkiln.compile(model, backend="aot_eager", job={"store": str(tmp_path)}, progress="off")
    with torch.no_grad():
        model(torch.randint(0, 128, (1, 8)))
        model(torch.randint(0, 128, (1, 12)))  # another length: compiled on this rank
    [group] = torchkiln.report(model).job.groups
    # Two layers share the group: the first layer's call of the new length is compiled into a
    # new entry of the store, which the second layer's call then fits.
    assert (group.fitted_calls, group.other_calls, group.written) == (3, 1, 1)
    assert (
        torchkiln.report(model)
        .job.lines()[1]
        .endswith(
            "; 1 of 4 calls did not fit it and were compiled here (1 into new entries of the store)"
        )
    )


def traced_twice(traced: Any) -> Any:
    """A ``wrap_traced`` wrapper (as activation checkpointing is one): the key must see it."""

    def twice(module: torch.nn.Module, /, *args: Any, **kwargs: Any) -> Any:
        return traced(module, *args, **kwargs)

    return twice


class WrapsTheTrace:
    @torchkiln.hookimpl
    def prepare_group(self) -> GroupPreparation:
        return GroupPreparation(wrap_traced=traced_twice)


@pytest.mark.needs_feature("precompiled artifacts")
def test_an_entry_never_serves_a_group_traced_through_other_wrappers(tmp_path: Path) -> None:
    """A group compiled inside a ``wrap_traced`` wrapper (FSDP2's activation checkpointing) is
    other code than the plain block's: its entry is keyed apart, so a store never hands one to
    the other (before, an entry saved without checkpointing served a checkpointed group)."""
    store = tmp_path / "store"
    ids = torch.randint(0, 128, (1, 8))
    pm = torchkiln.PluginManager()
    pm.register(WrapsTheTrace())
    wrapped = torchkiln.compile(
        llama(**SHAPE).eval(), backend="aot_eager", job={"store": str(store)}, plugins=pm,
        progress="off",
    )  # fmt: skip
    with torch.no_grad():
        wrapped(ids)
    [entry] = JobStore(store).published()
    assert read_meta(entry)["fields"]["traced"] == [f"{__name__}.traced_twice"]
    plain = torchkiln.compile(
        llama(**SHAPE).eval(), backend="aot_eager", job={"store": str(store)}, progress="off"
    )
    with torch.no_grad():
        plain(ids)
    [group] = torchkiln.report(plain).job.groups
    assert group.role == "compiled"  # not "store": the wrapped group's entry did not serve it
    assert sorted(read_meta(e)["fields"]["traced"] for e in JobStore(store).published()) == [
        [],
        [f"{__name__}.traced_twice"],
    ]
