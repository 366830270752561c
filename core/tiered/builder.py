"""The builder process: ``python -m torchkiln.tiered.builder WORKDIR``.

The user's process starts it when the model is compiled and, at the first call, has it compile
the whole model into the output directory's ``whole`` entry (the exchange is described in
:func:`main`). Dynamo runs only here, on this process's main thread: it is not thread-safe
(pytorch issues 118260 and 136833). The whole model is compiled by the configured backend's own
plugin (its ``compile_region``), served by this process's plugin manager: the built-ins and the
installed ``torchkiln`` entry points. A plugin that exists only as an object in the user's
process cannot reach it; a backend no plugin here declares, or one that cannot save, fails
the build with a result that says so (:func:`plugin_problem`). docs/tiered.md has the rest.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from torchkiln._internals.transformers import (
    can_record_registry,
    register_can_record,
    replace_can_record_registry,
)
from torchkiln.files import write_atomic

REQUEST = "request.pkl"
SYS_PATH = "sys_path.json"
PRELOAD = "preload.json"
RESULT = "result.json"
GO = b"build\n"
"""The line the user's process sends once the request is written."""


def preload(workdir: Path) -> None:
    """Import what the build will need while the user's process has not called the model
    yet; a module that fails to import here fails the build later, with its error."""
    import importlib

    import torchkiln.artifacts.whole_build  # noqa: F401  (torch, Dynamo, the artifact code)

    path = workdir / PRELOAD
    names = json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # unpickling the model imports it again and says why
            continue


def _limit(nice: int, intra_op_threads: int) -> None:
    """Lower this process's priority. Its CPU use is bounded by the environment the parent
    set (``OMP_NUM_THREADS``, ``TORCHINDUCTOR_COMPILE_THREADS``: inductor's compile workers);
    torch's intra-op thread count is set to the *parent's*, because the compiled function's
    global-state guard records it and would otherwise never match in the parent."""
    if nice:
        os.nice(nice)
    import torch

    torch.set_num_threads(intra_op_threads)


def _peak_rss_mb() -> float:
    # Linux reports kilobytes.
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def replay_construction_state(model: Any, registry_items: list[Any] | None) -> None:
    """Global state a library records when a model is *constructed*, which unpickling skips.

    transformers registers each ``PreTrainedModel`` class's recordable outputs in
    ``_CAN_RECORD_REGISTRY`` from ``__init__``, and a trace guards on its entries *by
    position*; so the registry is made exactly the user's process's (``registry_items``, in
    its order), or, without that, filled from the model.
    """
    registry = can_record_registry()
    if registry is None:
        return
    if registry_items is not None:
        replace_can_record_registry(registry, registry_items)
        return
    for module in model.modules():
        register_can_record(registry, module)


def warm_up(model: Any, family: dict[str, Any]) -> None:
    """Run the model once on fake tensors, on a copy of the call of its own.

    The user's process has run the model before it asks for a build, and libraries initialise
    global state lazily on a first call (transformers registers each model class for output
    capturing); Dynamo guards on that state, so the trace must see it as the user's process
    has it. Fake tensors carry metadata only: nothing reads the weights.
    """
    import torch

    from torchkiln._internals.fake_tensor import fake_tensor_mode
    from torchkiln.tiered.weightless import loads_weightless

    args, kwargs = loads_weightless(family["call"])
    training = model.training
    model.train(family["training"])
    try:
        with (
            fake_tensor_mode(allow_non_fake_inputs=True),
            torch.set_grad_enabled(family["kind"] == "training"),
        ):
            model(*args, **kwargs)
    finally:
        model.train(training)


def plugin_problem(config: Any, plugins: Any) -> str | None:
    """Why this process's ``plugins`` cannot build with ``config.backend`` (``None``: they
    can): no plugin here declares it, or its plugin does not declare it savable."""
    from torchkiln.artifacts.directory import ArtifactError
    from torchkiln.artifacts.whole_build import check_savable_backend

    if plugins.backend(config.backend) is None:
        return (
            f"backend {config.backend!r} is not declared by any plugin the builder process "
            "loads (the built-in plugins and the installed `torchkiln` entry points)"
            f"{plugins.missing_hint()}; a plugin passed as an object "
            "(torchkiln.compile(plugins=[...]) or a PluginManager of your own) exists only in "
            "your process; install it as a `torchkiln` entry point for tiered compilation to "
            "build the whole-model form with it"
        )
    try:
        check_savable_backend(config, plugins)
    except ArtifactError as error:
        return str(error)
    return None


def build(workdir: Path) -> dict[str, Any]:
    from torchkiln.artifacts.whole_build import Family, build_whole_form
    from torchkiln.plugin_host.default_manager import get_plugin_manager
    from torchkiln.tiered.weightless import loads_weightless

    request = loads_weightless((workdir / REQUEST).read_bytes())
    plugins = get_plugin_manager().ensure_loaded()
    problem = plugin_problem(request["config"], plugins)
    if problem is not None:
        return {"ok": False, "error": problem, "peak_rss_mb": _peak_rss_mb()}
    _limit(request["nice"], request["intra_op_threads"])
    model = loads_weightless(request["model"])
    replay_construction_state(
        model, loads_weightless(request["registry"]) if request.get("registry") else None
    )
    families = []
    for family in request["families"]:
        warm_up(model, family)
        args, kwargs = loads_weightless(family["call"])
        families.append(Family(family["kind"], family["training"], args, kwargs, family["dynamic"]))
    started = time.perf_counter()
    whole, skipped = build_whole_form(
        model,
        families,
        request["config"],
        Path(request["output"]),
        request["region_paths"],
        plugins,
        request["environment"],
    )
    return {
        "ok": bool(whole.entries),
        "entries": len(whole.entries),
        "skipped": skipped,
        "seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": _peak_rss_mb(),
        "dropped_guards": whole.dropped_guards,
    }


def main(argv: list[str]) -> int:
    """The builder's side of the exchange with the user's process, in ``WORKDIR`` (a directory
    only that user can write).

    Right after start: take the user's process's ``sys.path`` (``sys_path.json``; the
    environment is inherited), import torch and the model's modules (``preload.json``: seconds
    that would otherwise delay the build) and wait for a line on standard input. At the first
    call the user's process writes ``request.pkl`` (the weightless model, the calls to compile
    for, the configuration, the output directory) and then sends the line; standard input
    closed without one means no build is wanted, and the process exits. Then it lowers its
    priority and thread counts, builds, and writes ``result.json``: what it built, how long it
    took, its peak resident memory, or the error.
    """
    workdir = Path(argv[0])
    sys.path[:] = json.loads((workdir / SYS_PATH).read_text(encoding="utf-8"))
    try:
        preload(workdir)
        if sys.stdin.buffer.readline() != GO:
            return 0  # the model was never called, or was decompiled: nothing to build
        result = build(workdir)
    except BaseException as error:  # the parent reads the reason; nothing else sees it
        result = {
            "ok": False,
            "error": f"{type(error).__name__}: {error}"[:1000],
            "traceback": traceback.format_exc()[-4000:],
            "peak_rss_mb": _peak_rss_mb(),
        }
    write_atomic(workdir / RESULT, json.dumps(result))  # the parent polls for it
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
