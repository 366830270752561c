"""Count the torchkiln functions that a compile, a model's first call and a later call enter.

How much of torchkiln's own Python runs, phase by phase, on a default-config Llama
(``torchkiln.examples.llama``, 3 blocks by default), backend ``eager``: the distinct code
objects entered (``sys.setprofile``'s ``call`` events) whose file lies under the package's
``core/`` or ``plugins/`` directory (found from ``torchkiln.__file__`` and
``torchkiln.plugins.__file__``), and how many files they come from. A later call's count is the
torchkiln code on the path of every step (principle 6 of the design: at most a small frame per
block); the compile's is what a user waits through before the first call.

Before measuring, another copy of the model is compiled and called once in the same process, then
decompiled and Dynamo reset: the imports and one-time set-up are not counted, and the measured
first call still compiles. Only this thread is watched, and frames that Dynamo's eval-frame hook
runs as compiled code do not reach the profiler: what is counted is the Python torchkiln itself
runs.

Usage: ``python tools/count_functions.py [--depth 3] [--small] [--json PATH]
[--max-compile N] [--max-first N] [--max-later N]``; exits 1 when a phase enters more
functions than its ``--max-*`` (no check by default).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import torch
from torch import nn

import torchkiln
import torchkiln.examples
import torchkiln.plugins

PHASES = ("compile", "first call", "later call")
SMALL_SIZES = {"hidden_size": 64, "heads": 4, "kv_heads": 2, "intermediate_size": 128}
"""``--small``: a Llama of the same default config, at sizes that compile in a second (tests)."""


@dataclass(frozen=True)
class PhaseCount:
    """What one phase entered of torchkiln's code."""

    functions: int
    files: int


def package_directories() -> tuple[str, ...]:
    """The directories of torchkiln's code (``core/`` and ``plugins/`` in a checkout), each
    ending in a separator so that a sibling with a longer name does not match."""
    packages = (torchkiln.__file__, torchkiln.plugins.__file__)
    return tuple(os.path.dirname(os.path.abspath(str(path))) + os.sep for path in packages)


@contextmanager
def entered_code(directories: tuple[str, ...]) -> Iterator[set[CodeType]]:
    """While the block runs, collect the code objects entered (``call`` events, this thread)
    whose file lies under ``directories``; the profiler there before is put back after."""
    entered: set[CodeType] = set()
    ours: dict[CodeType, bool] = {}  # each code object's file is checked once

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code not in ours:
            ours[code] = code.co_filename.startswith(directories)
        if ours[code]:
            entered.add(code)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield entered
    finally:
        sys.setprofile(previous)


def _count(entered: set[CodeType]) -> PhaseCount:
    return PhaseCount(len(entered), len({code.co_filename for code in entered}))


def _warm_up(build: Callable[[], nn.Module], inputs: torch.Tensor, backend: str) -> None:
    """Compile and call another copy, then forget its compiled code (imports stay done)."""
    model = torchkiln.compile(build(), backend=backend)
    with torch.no_grad():
        model(inputs)
    torchkiln.decompile(model)
    torch.compiler.reset()


def count_phases(
    build: Callable[[], nn.Module], inputs: torch.Tensor, backend: str = "eager"
) -> dict[str, PhaseCount]:
    """The torchkiln code each phase enters: compiling a fresh ``build()``, its first call on
    ``inputs`` and a later call on the same ``inputs`` (after a warm-up, as the module says)."""
    _warm_up(build, inputs, backend)
    directories = package_directories()
    model = build()
    counts = {}
    with entered_code(directories) as entered:
        torchkiln.compile(model, backend=backend)
    counts["compile"] = _count(entered)
    with torch.no_grad():
        for phase in ("first call", "later call"):
            with entered_code(directories) as entered:
                model(inputs)
            counts[phase] = _count(entered)
    torchkiln.decompile(model)
    return counts


def over_limits(counts: dict[str, PhaseCount], limits: dict[str, int | None]) -> list[str]:
    """One line for each phase that entered more functions than its limit (``None``: none)."""
    return [
        f"{phase}: {counts[phase].functions} functions entered, more than the limit {limit}"
        for phase, limit in limits.items()
        if limit is not None and counts[phase].functions > limit
    ]


def table(counts: dict[str, PhaseCount]) -> str:
    rows = [f"{'phase':<12} {'functions':>9} {'files':>5}"]
    rows += [f"{phase:<12} {c.functions:>9} {c.files:>5}" for phase, c in counts.items()]
    return "\n".join(rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=3, help="decoder blocks (default 3)")
    parser.add_argument("--small", action="store_true", help=SMALL_SIZES.__repr__())
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--json", type=Path, help="write the counts to this file")
    for phase in ("compile", "first", "later"):
        parser.add_argument(f"--max-{phase}", type=int, help="exit 1 when over (no check)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    sizes = SMALL_SIZES if args.small else {}

    def build() -> nn.Module:
        torch.manual_seed(0)
        return torchkiln.examples.llama(depth=args.depth, **sizes)

    inputs = torchkiln.examples.example_inputs(build(), batch=1, seq=16)
    counts = count_phases(build, inputs, args.backend)
    limits = dict(zip(PHASES, (args.max_compile, args.max_first, args.max_later), strict=True))
    problems = over_limits(counts, limits)
    print(f"llama depth {args.depth}{' (small)' if args.small else ''}, backend {args.backend}")
    print(table(counts))
    if args.json is not None:
        record = {
            "model": {"depth": args.depth, **sizes},
            "backend": args.backend,
            "torch": torch.__version__,
            "phases": {phase: asdict(count) for phase, count in counts.items()},
            "limits": limits,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
