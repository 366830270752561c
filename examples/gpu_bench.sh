#!/usr/bin/env bash
# torchkiln bench --preset gpu on a machine with one CUDA GPU. Run it from the repository root:
#
#     OUT=/some/dir bash examples/gpu_bench.sh
#
# It installs nothing (no network needed): python3 must already import torch (>= 2.11, CUDA),
# attrs, cattrs, pluggy, yaml, transformers, accelerate and matplotlib. When torchkiln itself
# is not installed, it runs from this checkout's sources (staged as a package in a temporary
# directory, since the sources live in core/ and plugins/). Writes into $OUT (default
# ./bench-gpu-out): bench-gpu.json (rewritten after every cell, so a killed run keeps what it
# measured), bench-gpu.png (at the end) and bench-gpu.log (everything printed).
# BUDGET_MINUTES (default 8) is the bench's time budget: no cell starts after it.
set -uo pipefail

OUT="${OUT:-$PWD/bench-gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

if ! python3 -c "import torchkiln" 2>/dev/null; then
    stage="$(mktemp -d)"
    cp -r core "$stage/torchkiln"
    cp -r plugins "$stage/torchkiln/plugins"
    export PYTHONPATH="$stage${PYTHONPATH:+:$PYTHONPATH}"
fi

missing="$(python3 - <<'PY'
import importlib.util
needed = ["torch", "attrs", "cattrs", "pluggy", "yaml", "transformers", "accelerate", "matplotlib"]
print(" ".join(n for n in needed if importlib.util.find_spec(n) is None))
PY
)"
if [ -n "$missing" ]; then
    echo "gpu_bench.sh: python3 cannot import: $missing (this script installs nothing)" >&2
    exit 2
fi

# LIMIT_SECONDS (default 570) stops the whole bench with SIGINT if it is still running then
# (its budget plus the grace for a cell running at the budget's end normally ends it first),
# so it stays inside a 10-minute command limit; the JSON keeps every finished cell.
status=0
timeout -s INT "${LIMIT_SECONDS:-570}" python3 -m torchkiln bench --preset gpu \
    --budget-minutes "${BUDGET_MINUTES:-8}" \
    --json "$OUT/bench-gpu.json" --plot "$OUT/bench-gpu.png" 2>&1 | tee "$OUT/bench-gpu.log" \
    || status=$?

if [ ! -f "$OUT/bench-gpu.png" ] && [ -f "$OUT/bench-gpu.json" ]; then
    echo "gpu_bench.sh: the bench stopped early (exit $status); tables and plot from its JSON:" \
        | tee -a "$OUT/bench-gpu.log"
    python3 -m torchkiln bench --from-json "$OUT/bench-gpu.json" --plot "$OUT/bench-gpu.png" \
        2>&1 | tee -a "$OUT/bench-gpu.log" || true
fi
exit "$status"
