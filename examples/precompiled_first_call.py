"""Where a precompiled first call's time goes, in a new process with an empty inductor cache.

Loads the artifact directory into the example Llama (inductor, CPU) the way the bench's
``precompiled`` cell does (``torchkiln.compile(model, artifacts=DIR)`` plus the first forward)
and times its parts: copying ``DIR/kernels`` into the cache, torch's
``load_compiled_function`` (deserialising, importing and loading the generated module and its
C++ kernels), inductor's CPU instruction-set probe, the fallback ``torch.compile`` (built
only if a call does not fit the loaded function), and the first forward next to a second one.
It also prints the main thread's CPU seconds of ``torchkiln.compile``, which a busy machine
inflates less than the wall-clock time.

``--probe`` lets the probe run as it did before torchkiln answered it from the artifacts;
``--parse-templates`` lets inductor parse its kernel templates while loading, as it did
before torchkiln deferred them; ``--eager-fallback`` builds the fallback at compile time, as
before it was made lazy.

    torchkiln precompile llama:32 --output /tmp/kiln-llama32 --backend inductor --batch 1 --seq 128
    python examples/precompiled_first_call.py /tmp/kiln-llama32
    python examples/precompiled_first_call.py /tmp/kiln-llama32 --probe --parse-templates --eager-fallback
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-first-call-")
started = time.perf_counter()
import torch  # noqa: E402  (timed: the import is not part of the first call)

imported = time.perf_counter()
from torch._inductor import cpu_vec_isa  # noqa: E402

import torchkiln  # noqa: E402
import torchkiln.artifacts.deferred_templates as deferred_templates  # noqa: E402
import torchkiln.artifacts.precompiled as precompiled  # noqa: E402
import torchkiln.jobs.entry as entry  # noqa: E402
import torchkiln.plugins.backends as backends  # noqa: E402
from torchkiln.configuration.config import CompileConfig  # noqa: E402
from torchkiln.engine.group_runtime import GroupCode  # noqa: E402
from torchkiln.examples import example_inputs, llama  # noqa: E402

spent: dict[str, float] = {}


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - begin

    return wrapper


class ImportClock:
    """Wall time of the outermost imports that add modules (``import`` statements, pickle's
    class lookups and ``importlib.import_module``), and how many modules they added."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.modules = 0
        self._depth = 0

    def wrap(self, importer: Callable[..., Any]) -> Callable[..., Any]:
        def timed_import(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return importer(*args, **kwargs)
            self._depth += 1
            count, begin = len(sys.modules), time.perf_counter()
            try:
                return importer(*args, **kwargs)
            finally:
                self._depth -= 1
                if len(sys.modules) > count:
                    self.seconds += time.perf_counter() - begin
                    self.modules += len(sys.modules) - count

        return timed_import

    def install(self) -> None:
        builtins.__import__ = self.wrap(builtins.__import__)
        importlib.import_module = self.wrap(importlib.import_module)


def _eager_fallback() -> None:
    """Build each served group's fallback ``torch.compile`` as its sources' code loads, as
    before the backend's code was built only for a call none of them fits."""
    serve = GroupCode._serve

    def building(self: GroupCode, loaded: Any) -> None:
        serve(self, loaded)
        self._built = self._build()

    GroupCode._serve = building  # type: ignore[method-assign]


def main(directory: str, options: list[str]) -> None:
    backends.compile_with_torch = timed(
        "fallback torch.compile (imports inductor's compile stack)", backends.compile_with_torch
    )
    entry.copy_kernels = timed("copying the entries' kernels into the cache", entry.copy_kernels)
    clock = ImportClock()
    real_load = torch.compiler.load_compiled_function

    def load(*args: Any, **kwargs: Any) -> Any:
        imports = clock.seconds
        try:
            return real_load(*args, **kwargs)
        finally:
            spent["  of which imports"] = spent.get("  of which imports", 0.0) + (
                clock.seconds - imports
            )

    torch.compiler.load_compiled_function = timed(
        "load_compiled_function (unpickling, the generated module, kernels, guards)", load
    )
    listing = cpu_vec_isa.valid_vec_isa_list
    probe_timer = timed("inductor's CPU ISA probe", listing)
    probe_timer.cache_info = listing.cache_info  # type: ignore[attr-defined]
    probe_timer.cache_clear = listing.cache_clear  # type: ignore[attr-defined]
    cpu_vec_isa.valid_vec_isa_list = probe_timer
    if "--probe" in options:
        precompiled.answered_probes = lambda record: contextlib.nullcontext()
    if "--parse-templates" in options:
        deferred_templates.deferred_templates = contextlib.nullcontext
    if "--eager-fallback" in options:
        _eager_fallback()
    depth = 32
    model = llama(depth=depth)
    ids = example_inputs(model, 1, 128)
    clock.install()
    built = time.perf_counter()
    cpu = time.thread_time()
    config = CompileConfig(
        backend="inductor", artifacts=directory, artifacts_strict=True, progress="off"
    )
    compiled = torchkiln.compile(model, config)
    loaded = time.perf_counter()
    cpu = time.thread_time() - cpu
    with torch.no_grad():
        compiled(ids)
    first = time.perf_counter()
    with torch.no_grad():
        compiled(ids)
    second = time.perf_counter()
    print(f"import torch {imported - started:.2f} s, building the model {built - imported:.2f} s")
    print(
        f"first call {first - built:.2f} s = torchkiln.compile {loaded - built:.2f} s "
        f"+ first forward {first - loaded:.2f} s (a second forward: {second - first:.2f} s); "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"  torchkiln.compile: {cpu:.2f} CPU seconds")
    print(f"  imports during the first call: {clock.seconds:.2f} s ({clock.modules} modules)")
    of_which = spent.pop("  of which imports", None)
    for name, seconds in spent.items():
        print(f"  {name}: {seconds:.2f} s")
        if name.startswith("load_compiled_function") and of_which is not None:
            print(f"    of which imports: {of_which:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
