"""Where a precompiled first call's time goes, in a new process with an empty inductor cache.

Loads the artifact directory into the example Llama (inductor, CPU) the way the bench's
``precompiled`` cell does (``torchkiln.compile(model, artifacts=DIR)`` plus the first forward)
and times its parts: the fallback ``torch.compile`` each group still gets (it imports
inductor's compile stack), copying ``DIR/kernels`` into the cache, torch's
``load_compiled_function`` (deserialising, loading the generated module and its C++
kernels), inductor's CPU instruction-set probe, and the first forward next to a second one.
``--probe`` lets the probe run as it did before torchkiln answered it from the artifacts.

    torchkiln precompile llama:32 --output /tmp/kiln-llama32 --backend inductor --batch 1 --seq 128
    python examples/precompiled_first_call.py /tmp/kiln-llama32
    python examples/precompiled_first_call.py /tmp/kiln-llama32 --probe
"""

from __future__ import annotations

import contextlib
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
import torchkiln.plugins.backends as backends  # noqa: E402
import torchkiln.precompiled as precompiled  # noqa: E402
from torchkiln.config import CompileConfig  # noqa: E402
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


def main(directory: str, probe: bool) -> None:
    backends.compile_with_torch = timed(
        "fallback torch.compile (imports inductor's compile stack)", backends.compile_with_torch
    )
    precompiled.copy_kernels = timed("copying DIR/kernels into the cache", precompiled.copy_kernels)
    torch.compiler.load_compiled_function = timed(
        "load_compiled_function (module, kernels)", torch.compiler.load_compiled_function
    )
    listing = cpu_vec_isa.valid_vec_isa_list
    probe_timer = timed("inductor's CPU ISA probe", listing)
    probe_timer.cache_info = listing.cache_info  # type: ignore[attr-defined]
    probe_timer.cache_clear = listing.cache_clear  # type: ignore[attr-defined]
    cpu_vec_isa.valid_vec_isa_list = probe_timer
    if probe:
        precompiled.answered_probes = lambda record: contextlib.nullcontext()
    depth = 32
    model = llama(depth=depth)
    ids = example_inputs(model, 1, 128)
    built = time.perf_counter()
    config = CompileConfig(
        backend="inductor", artifacts=directory, artifacts_strict=True, progress="off"
    )
    compiled = torchkiln.compile(model, config)
    loaded = time.perf_counter()
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
    for name, seconds in spent.items():
        print(f"  {name}: {seconds:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1], "--probe" in sys.argv[2:])
