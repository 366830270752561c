"""The report follows what happens on every call, not only the first: recompile-limit hits and
graph breaks on later calls, regions still running compiled code told apart from regions running
eagerly, one line per reason, named causes with their remedy."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
from torch import nn

import torchkiln

WIDTH = 16


class Gated(nn.Module):
    """A block with a bool attribute (specialised by Dynamo) and an optional graph break."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.gate = True
        self.debug = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.linear(x) if self.gate else x - self.linear(x)
        if self.debug:
            print("debugging", end="")  # a graph break
        return x


class Stack(nn.Module):
    def __init__(self, block: type[nn.Module] = Gated, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(block() for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


@pytest.fixture
def recompile_limit() -> Iterator[None]:
    with torch._dynamo.config.patch(recompile_limit=1):
        yield


def inputs(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(2, WIDTH, dtype=dtype, requires_grad=True)


def compiled(model: nn.Module) -> nn.Module:
    return torchkiln.compile(model, backend="eager", progress="off")


def notes(report: torchkiln.CompileReport, start: str) -> list[str]:
    """The report's note lines that start with ``start``."""
    return [line for line in str(report).splitlines() if line.startswith(f"  {start}")]


def test_a_later_limit_hit_shows_where_it_happened_and_who_still_runs_compiled(
    recompile_limit: None,
) -> None:
    model = compiled(Stack())
    for _ in range(3):
        model(inputs())
    model.blocks[2].gate = False
    for _ in range(100):
        model(inputs())
    report = torchkiln.report(model)
    status = {r.path: r.status for r in report.regions}
    assert status == {
        "blocks.0": "compiled",
        "blocks.1": "compiled",
        "blocks.2": "eager",
        "blocks.3": "compiled",
    }
    hit = report.regions[2]
    assert hit.recompile_limit_hit and "later call" in (hit.fallback_reason or "")
    [limit_line] = notes(report, "recompile limit hit")
    assert limit_line.startswith("  recompile limit hit in blocks.2 (later calls): ")
    assert limit_line.endswith("no cached graph fits (1 cached): L['module'].gate == True")
    [still] = notes(report, "still compiled in")
    assert "blocks.0, blocks.1, blocks.3 (later calls)" in still
    assert "0/" not in str(report)


def test_a_later_limit_hit_affecting_every_region_says_so_once(recompile_limit: None) -> None:
    model = compiled(Stack())
    model(inputs())
    model.double()
    model(inputs(torch.float64))
    report = torchkiln.report(model)
    assert [r.status for r in report.regions] == ["eager"] * 4
    assert report.regions[0].recompile_limit_hit
    [hit] = notes(report, "recompile limit hit")
    assert hit.startswith("  recompile limit hit in blocks.0 (later calls): no cached graph fits")
    assert "dtype mismatch" in hit
    [affected] = notes(report, "runs eagerly in blocks.1")
    assert affected.startswith("  runs eagerly in blocks.1, blocks.2, blocks.3 (later calls)")


def test_graph_breaks_and_recompiles_on_later_calls_are_counted_per_region() -> None:
    model = compiled(Stack())
    model(inputs())
    model.blocks[1].debug = True
    for _ in range(5):
        model(inputs())
    report = torchkiln.report(model)
    by_path = {r.path: r for r in report.regions}
    assert by_path["blocks.1"].later_graphs >= 1
    assert sum(by_path["blocks.1"].later_graph_breaks.values()) >= 1
    assert all(by_path[p].later_graphs == 0 for p in ("blocks.0", "blocks.2", "blocks.3"))
    assert by_path["blocks.1"].graphs_by_phase["first calls"] == 0
    assert [r.status for r in report.regions] == ["compiled"] * 4
    [recompile] = notes(report, "recompile in blocks.1 (later calls)")
    assert "module.debug" in recompile


class ItemReading(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * x.sum().item()


SCALE: contextvars.ContextVar[float] = contextvars.ContextVar("scale", default=1.0)


class ContextReading(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * SCALE.get()


class MaybeNone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.bias_tensor: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        return out if self.bias_tensor is None else out + self.bias_tensor


def _set_none_in_some(model: nn.Module) -> None:
    model.blocks[1].bias_tensor = torch.ones(WIDTH)


@pytest.mark.parametrize(
    ("block", "prepare", "cause"),
    [
        (ItemReading, None, ".item() in a block"),
        (ContextReading, None, "a ContextVar read inside a block"),
        (MaybeNone, _set_none_in_some, "a None attribute"),
    ],
    ids=["item", "contextvar", "none-attribute"],
)
def test_known_causes_are_named_with_their_remedy_once(
    block: type[nn.Module], prepare: object, cause: str
) -> None:
    model = compiled(Stack(block))
    x = torch.randn(2, WIDTH)
    with torch.no_grad():
        model(x)
        if callable(prepare):  # after the first calls: planning groups what is alike then
            prepare(model)
        model(x)
    report = torchkiln.report(model)
    text = str(report)
    if (
        block is ContextReading
        and sum(r.graph_break_count + sum(r.later_graph_breaks.values()) for r in report.regions)
        == 0
    ):
        # torch 2.15 traces ContextVar.get(): nothing breaks, so there is no cause to name.
        assert "[cause:" not in text, text
        assert [r.status for r in report.regions][:1] == ["compiled"]
        return
    assert f"[cause: {cause}]" in text, text
    assert len(notes(report, f"remedy for {cause}:")) == 1


@pytest.mark.parametrize(
    ("kind", "text", "cause"),
    [
        ("guard", "L['module'].drop_path.drop_prob == 0.1", "a specialised int/float attribute"),
        ("guard", "module.scale == 0.5", "a specialised int/float attribute"),
        ("guard", "L['module'].layer_idx == 3", "a specialised int/float attribute"),
        ("guard", "L['module'].adapter is None", "a None attribute"),
        (
            "guard",
            "L['kwargs']['past_key_values'].layers[3].keys.size()[2] == 7",
            "per-layer cache state",
        ),
        (
            "graph break",
            "Unsupported Tensor.item() call with capture_scalar_outputs=False",
            ".item() in a block",
        ),
        ("graph break", "Attempted to call ContextVar.get", "a ContextVar read inside a block"),
        ("guard", "tensor 'args[0]' size mismatch at index 1. expected 8, actual 16", None),
    ],
)
def test_causes_match_dynamos_wording(kind: str, text: str, cause: str | None) -> None:
    from torchkiln.plugin_host.report_causes import BUILTIN_CAUSES, match_cause

    found = match_cause(kind, [text], BUILTIN_CAUSES)
    assert (found.name if found else None) == cause


def test_verbose_keeps_dynamos_full_text() -> None:
    model = compiled(Stack(ItemReading))
    with torch.no_grad():
        model(inputs())
    short, verbose = str(torchkiln.report(model)), str(torchkiln.report(model, verbose=True))
    assert len(verbose.splitlines()) > len(short.splitlines())
    assert all(len(line) < 400 for line in short.splitlines())


@torch._dynamo.disable
def vendor_op(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class VendorBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return vendor_op(self.linear(x))


class VendorBackend:
    """A backend whose declaration carries a named cause for its own op."""

    @torchkiln.hookimpl
    def declare_backends(self) -> list[object]:
        from torchkiln.plugin import BackendSpec, ReportCause

        cause = ReportCause(
            "the vendor op", r"vendor_op", "use vendor.fused_op, which compiles", ("graph break",)
        )
        return [BackendSpec("vendorx", report_causes=(cause,))]

    @torchkiln.hookimpl
    def compile_region(self, fn: object, config: object, backend: str) -> object:
        from torchkiln.plugin import compile_with_torch

        return compile_with_torch(fn, config, backend="eager") if backend == "vendorx" else None


def test_a_plugin_declares_its_own_causes() -> None:
    pm = torchkiln.PluginManager(entry_points=False, env={})
    pm.register(VendorBackend(), name="vendor")
    model = torchkiln.compile(Stack(VendorBlock), plugins=pm, backend="vendorx", progress="off")
    with torch.no_grad():
        model(torch.randn(2, WIDTH))
    report = torchkiln.report(model)
    [line] = notes(report, "graph break in")
    assert line.endswith("[cause: the vendor op]")
    assert notes(report, "remedy for the vendor op:") == [
        "  remedy for the vendor op: use vendor.fused_op, which compiles"
    ]
