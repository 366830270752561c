"""Time to whole-model speed when the user's process leaves the CPU to the builder.

``torchkiln bench``'s tiered cell calls the model back to back while the builder compiles, so
on a CPU-only machine the two share the cores (a training step on a GPU leaves them to the
builder instead). This script measures both sides of that on one machine, each in a fresh
process with an empty inductor cache:

* ``full``: ``torch.compile``'s cold first call;
* ``tiered-idle``: ``torchkiln.compile(tiered=True)``'s first call, then no call until the
  builder has finished (``torchkiln.tiered.wait``), then one call served by the whole-model form.

Run: ``python examples/tiered_idle_foreground.py [DEPTH]`` (default 16); it prints JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import torchkiln, torchkiln.tiered
    from torchkiln.examples import example_inputs, llama

    kind, depth = sys.argv[1], int(sys.argv[2])
    model = llama(depth=depth)
    ids = example_inputs(model, 1, 128)
    started = time.perf_counter()
    with torch.no_grad():
        if kind == "full":
            torch.compile(model)(ids)
            print(json.dumps({"first_call": time.perf_counter() - started}))
        else:
            # an idle foreground leaves the cores to the builder: start it (tiered.when)
            tiered = {"enabled": True, "when": "always"}
            compiled = torchkiln.compile(model, tiered=tiered, progress="off")
            compiled(ids)
            first = time.perf_counter() - started
            assert torchkiln.tiered.wait(compiled, 1800)
            compiled(ids)
            tiers = torchkiln.tiered.tiers(compiled)
            assert tiers.calls["whole-model"] == 1, tiers.lines()
            print(json.dumps({
                "first_call": first,
                "to_whole_model": time.perf_counter() - started,
                "build_seconds": tiers.build_seconds,
            }))
    """
)


def run(kind: str, depth: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        done = subprocess.run(
            [sys.executable, "-c", CHILD, kind, str(depth)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    depth = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    full = run("full", depth)
    tiered = run("tiered-idle", depth)
    ratio = tiered["to_whole_model"] / full["first_call"]
    print(json.dumps({"depth": depth, "full": full, "tiered_idle": tiered,
                      "to_whole_model_x_full_cold": round(ratio, 3)}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
