"""Print the plan zoo's graph counts: ``python tests/planning/zoo_table.py [NAME ...]``.

Per model: the plan's groups and regions, the distinct shapes of the model's blocks, the graphs
torchkiln compiled over two calls (``backend="eager"``, from Dynamo's counters), the graphs of a
full ``torch.compile`` of the same model, and the regions that ran eagerly or hit the recompile
limit. docs/planning.md shows its output; tests/planning/test_plan_zoo.py asserts the bounds.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import torch
import torch._dynamo
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torchkiln
from torchkiln.plugin import StructureIndex

from plan_zoo import CASES, ZooCase  # isort: skip


def graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def row(case: ZooCase) -> str:
    model = case.build()
    inputs = case.inputs(model)
    index = StructureIndex()
    shapes = len({index.key(m) for m in model.modules() if type(m).__name__ in case.blocks})
    plan = torchkiln.plan(model, backend="eager")
    with torch.no_grad():
        torch._dynamo.reset()
        counters.clear()
        torch.compile(model, backend="eager")(**inputs)
        full = graphs()
        torch._dynamo.reset()
        counters.clear()
        torchkiln.compile(model, backend="eager", progress="off")
        model(**inputs)
        model(**inputs)
    report = torchkiln.report(model)
    eager = sum(r.status != "compiled" for r in report.regions)
    limit = sum(bool(r.recompile_limit_hit) for r in report.regions)
    note = "EncoderDecoderCache, split per layer" if case.cached else ""
    return (
        f"| {case.name} | {case.family} | {len(plan.groups)} | {plan.region_count} | {shapes} "
        f"| {graphs()} | {full} | {eager} | {limit} | {note} |"
    )


def main(names: list[str]) -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    print(
        "| model | family | groups | regions | block shapes | graphs | full compile | eager | limit hits | |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in CASES:
        if not names or case.name in names:
            print(row(case), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
