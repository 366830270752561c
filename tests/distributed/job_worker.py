"""One rank of a job that compiles once per job, run by ``torchrun`` from ``test_jobs.py``.

``python -m torch.distributed.run --nproc_per_node=2 job_worker.py OUT_DIR SETTINGS_JSON``

SETTINGS_JSON: ``backend``, ``store`` (a directory, ``{rank}`` and ``{node}`` filled in, or
null: ``job.store``), ``one_store`` (a directory: ``store=``, tiers off), ``share``, ``strategy``
(``fsdp2`` takes ``checkpointing`` and ``replicate_degree``: HSDP), ``depth`` (the Llama's,
else ``SHAPE``'s), ``save_params`` (each rank writes ``params<N>.pt``), ``steps``, ``timeout`` and ``fault``: ``null``,
``kill-source`` (rank 0 dies while it compiles), ``corrupt`` (rank 1 flips a byte of a kernel
it received), ``differ`` (rank 1 builds a wider model), ``rank_constant`` (each rank scales its
blocks' attention by a constant of its own), ``rank_in_code`` (each block's MLP reads the rank
while it runs: a constant only the traced graph shows), ``late`` (rank 1 reaches its first call after
``timeout``); ``regions`` (the ``regions`` option, as given); ``eager_reference`` (the first batch's loss of an uncompiled
copy, ``eager_first_loss``). Each rank trains a default-config Llama
a few steps with DDP and writes ``OUT_DIR/rank<N>.json``: the report's job lines, its losses,
the graphs a backend compiled on the rank (torch's AOTAutograd counter: an independent witness), and the CPU
seconds of the first step, children (inductor's compile workers) included.
"""

from __future__ import annotations

import copy
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import torchkiln
from torchkiln._internals import dynamo
from torchkiln.examples import llama

SHAPE = {"depth": 3, "hidden_size": 64, "heads": 4, "kv_heads": 2, "intermediate_size": 128,
         "vocab_size": 256}  # fmt: skip


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def apply_fault(fault: str | None, rank: int) -> None:
    if fault == "kill-source" and rank == 0:
        from torchkiln.jobs import share

        def die(*args: Any, **kwargs: Any) -> Any:
            time.sleep(2)  # rank 1 is waiting for the entry by now
            os._exit(17)

        share.build_entry = die
    if fault == "corrupt" and rank == 1:
        from torchkiln.jobs import share

        unpack = share.unpack_entry

        def corrupting(message: bytes, directory: Path) -> None:
            unpack(message, directory)
            kernel = next(
                p for p in sorted(directory.rglob("*")) if p.is_file() and "kernels" in p.parts
            )
            data = bytearray(kernel.read_bytes())
            data[len(data) // 2] ^= 0xFF
            kernel.write_bytes(bytes(data))

        share.unpack_entry = corrupting


def plant_rank_in_code() -> None:
    """Each block's MLP scales its output by ``1 + 2 * rank``, read from
    ``torch.distributed.get_rank()`` while it runs: Dynamo folds the call into a constant of the
    graph, with no guard and no attribute a key could see (pytorch#191878's hazard)."""
    from transformers.models.llama import modeling_llama

    mlp_forward = modeling_llama.LlamaMLP.forward

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        return mlp_forward(self, x) * (1.0 + 2.0 * dist.get_rank())

    modeling_llama.LlamaMLP.forward = forward


def run(out_dir: Path, settings: dict[str, Any]) -> dict[str, Any]:
    rank = dist.get_rank()
    node = int(os.environ.get("GROUP_RANK", "0"))
    apply_fault(settings.get("fault"), rank)
    shape = dict(SHAPE)
    shape["depth"] = settings.get("depth", shape["depth"])
    if settings.get("fault") == "differ" and rank == 1:
        shape["hidden_size"] = 96
    torch.manual_seed(0)
    model = llama(**shape)
    if settings.get("fault") == "rank_constant":  # a rank-dependent constant in one block class
        for layer in model.model.layers:
            layer.self_attn.scaling *= 1.0 + 2.0 * rank
    if settings.get("fault") == "rank_in_code":  # the rank, read while tracing: no attribute
        plant_rank_in_code()
    # The same model, never compiled: its loss on the first batch is what this rank's own code
    # gives (before any step, so no gradient exchange is needed to match it).
    eager = copy.deepcopy(model) if settings.get("eager_reference") else None
    store = settings.get("store")
    job = {"share": settings.get("share", "auto"), "timeout": settings.get("timeout", 120)}
    places: dict[str, Any] = {"cache_dir": str(out_dir / f"inductor-cache-{rank}")}
    if store:
        job["store"] = store.format(rank=rank, node=node)
    if settings.get("one_store"):  # store=: kernels and entries in one directory, no tiers
        places = {"store": settings["one_store"], "tiered": {"enabled": False}}
    strategy: Any = settings.get("strategy", "ddp")
    if strategy == "fsdp2":
        checkpointing = settings.get("checkpointing", False)
        fsdp2 = {"activation_checkpointing": checkpointing}
        if settings.get("replicate_degree"):  # HSDP: a (replicate, shard) mesh
            fsdp2["replicate_degree"] = settings["replicate_degree"]
        strategy = {"strategy": "fsdp2", "fsdp2": fsdp2}
    if settings.get("regions"):
        places["regions"] = settings["regions"]
    model = torchkiln.compile(
        model,
        backend=settings.get("backend", "aot_eager"),
        distributed=strategy,
        job=job,
        progress="off",
        **places,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    if settings.get("fault") == "late" and rank == 1:
        time.sleep(settings["timeout"] + 15)  # rank 0 gives up on it first
    generator = torch.Generator().manual_seed(100 + rank)
    losses, first_step_cpu, first_step_s = [], 0.0, 0.0
    eager_first_loss: float | None = None
    for step in range(settings.get("steps", 3)):
        ids = torch.randint(0, shape["vocab_size"], (2, 16), generator=generator)
        if step == 0 and eager is not None:
            with torch.no_grad():
                eager_first_loss = eager(ids, labels=ids).loss.item()
        cpu, wall = cpu_seconds(), time.perf_counter()
        loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 0:
            first_step_cpu, first_step_s = cpu_seconds() - cpu, time.perf_counter() - wall
        losses.append(loss.item())
    report = torchkiln.report(model)
    job_report = report.job
    if settings.get("save_params"):  # this rank's parameters (FSDP2: its shards)
        params = {
            n: getattr(p, "to_local", p.detach)().detach() for n, p in model.named_parameters()
        }
        torch.save(params, out_dir / f"params{rank}.pt")
    counters = dynamo.counters()
    return {
        "rank": rank,
        "losses": losses,
        "eager_first_loss": eager_first_loss,
        "first_step_cpu": first_step_cpu,
        "first_step_s": first_step_s,
        # Graphs a backend compiled (AOTAutograd's counter): Dynamo's own also counts the graph
        # each rank traces, without compiling it, for the rank-invariance check.
        "compiled_graphs": int(counters["aot_autograd"]["total"]),
        "cache_counters": {  # torch's own: what this rank's compiles found in its caches
            f"{kind}.{name}": int(value)
            for kind in ("inductor", "aot_autograd")
            for name, value in counters[kind].items()
            if "cache" in name
        },
        "job_lines": job_report.lines() if job_report is not None else [],
        "sharing": job_report.sharing if job_report is not None else None,
        "groups": [
            {
                "group": g.group,
                "role": g.role,
                "source": g.source,
                "reason": g.reason,
                "stored": g.stored,
                "bytes": g.bytes,
                "compile_seconds": g.compile_seconds,
            }
            for g in (job_report.groups if job_report is not None else ())
        ],
        "regions": [
            {
                "path": r.path,
                "graphs": r.graphs,
                "compile_seconds": r.compile_seconds,
                "loaded_from": r.loaded_from,
                "load_seconds": r.load_seconds,
            }
            for r in report.regions
        ],
        "load_seconds": [g.load_seconds for g in (job_report.groups if job_report else ())],
    }


def main() -> None:
    out_dir, settings = Path(sys.argv[1]), json.loads(sys.argv[2])
    if (
        "init" in settings
    ):  # started by hand, not by torchrun (which stops every rank when one dies)
        init = settings["init"]
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{init['port']}", rank=init["rank"], world_size=2
        )
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        result = run(out_dir, settings)
    except Exception as error:
        result = {"rank": rank, "error": f"{type(error).__name__}: {error}",
                  "traceback": traceback.format_exc()}  # fmt: skip
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result, indent=1))
    if "error" not in result:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
