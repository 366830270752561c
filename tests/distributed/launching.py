"""Launch real 2-process runs with ``torchrun`` (``python -m torch.distributed.run``) on CPU.

A module of its own (not ``conftest``): several test folders have a ``conftest.py``."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
WORKER = HERE / "worker.py"
NPROC = 2
TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The parent's environment without its TORCHKILN_* settings, plus what CPU runs need."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHKILN_")}
    env.update(
        {
            "DS_ACCELERATOR": "cpu",
            "OMP_NUM_THREADS": "1",
            # DeepSpeed JIT-builds a shared-memory op once (about 40 s); every run shares the build.
            "TORCH_EXTENSIONS_DIR": os.environ.get(
                "TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions")
            ),
            "PYTHONUNBUFFERED": "1",
            # A rank that dies on a signal prints every thread's Python stack.
            "PYTHONFAULTHANDLER": "1",
        }
    )
    env.update(extra or {})
    return env


def torchrun(
    script: Path,
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    nproc: int = NPROC,
) -> subprocess.CompletedProcess[str]:
    def command() -> list[str]:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            str(script),
            *args,
        ]

    return launch(command, cwd=cwd, env=env)


# libstdc++'s message when a joinable C++ thread is destroyed. Seen once in about fifty CPU runs,
# on rank 0 after both ranks had printed their results: gloo's threads being torn down at exit.
TEARDOWN_ABORT = "terminate called without an active exception"


def launch(
    command: Callable[[], list[str]], *, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a launcher command (see :func:`launch_nodes`)."""
    return launch_nodes(lambda: [command()], cwd=cwd, env=env)


def launch_nodes(
    commands: Callable[[], list[list[str]]],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run launcher commands side by side (one per simulated machine) and merge their results:
    the first non-zero exit status, and each one's output under a header.

    Run once more, with a warning, only after a teardown abort. The retry is narrow on purpose:
    any other failure, or a second abort, fails the test."""
    for attempt in (1, 2):
        process = _run_side_by_side(commands(), cwd, env)  # fresh ports each attempt
        if process.returncode == 0 or TEARDOWN_ABORT not in process.stderr or attempt == 2:
            return process
        warnings.warn(
            f"retrying after a teardown abort in a launched process:\n{describe(process)}",
            stacklevel=3,
        )
    raise AssertionError("unreachable")


def _run_side_by_side(
    commands: list[list[str]], cwd: Path, env: Mapping[str, str] | None
) -> subprocess.CompletedProcess[str]:
    # Output goes to files, not pipes: a launcher blocked on a full pipe while the test waits on
    # another one would hang both until the timeout.
    with contextlib.ExitStack() as stack:
        files = [
            (
                stack.enter_context(tempfile.TemporaryFile("w+")),
                stack.enter_context(tempfile.TemporaryFile("w+")),
            )
            for _ in commands
        ]
        running = [
            subprocess.Popen(
                command, cwd=cwd, env=launch_env(env), stdout=out, stderr=err, text=True
            )
            for command, (out, err) in zip(commands, files, strict=True)
        ]
        deadline = time.monotonic() + TIMEOUT_S
        try:
            for child in running:
                # past the deadline: killed below, and the output says where each one was
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=max(deadline - time.monotonic(), 1))
        finally:
            for child in running:
                if child.poll() is None:
                    child.kill()
                    child.wait()
        outputs = []
        for out, err in files:
            out.seek(0)
            err.seek(0)
            outputs.append((out.read(), err.read()))
    codes = [child.returncode for child in running]
    if len(commands) == 1:
        return subprocess.CompletedProcess(commands[0], codes[0], *outputs[0])
    stdout = "".join(f"--- node {i} stdout\n{out}" for i, (out, _) in enumerate(outputs))
    stderr = "".join(f"--- node {i} stderr\n{err}" for i, (_, err) in enumerate(outputs))
    return subprocess.CompletedProcess(
        commands, next((code for code in codes if code), 0), stdout, stderr
    )


def describe(process: subprocess.CompletedProcess[str]) -> str:
    return f"exit {process.returncode}\n--- stdout\n{process.stdout[-4000:]}\n--- stderr\n{process.stderr[-8000:]}"


def read_ranks(
    out_dir: Path, process: subprocess.CompletedProcess[str], nproc: int = NPROC
) -> list[dict[str, Any]]:
    assert process.returncode == 0, describe(process)
    ranks = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(nproc)]
    for r, data in enumerate(ranks):
        assert "error" not in data, f"rank {r} failed:\n{data['error']}"
    return ranks


def max_param_diff(one: Path, two: Path, ranks: int = 2) -> float:
    """The largest difference between two jobs' parameters, over every rank's
    ``params<N>.pt`` (the workers' ``save_params``: each rank's shards under FSDP2)."""
    import torch

    worst = 0.0
    for rank in range(ranks):
        a, b = torch.load(one / f"params{rank}.pt"), torch.load(two / f"params{rank}.pt")
        assert a.keys() == b.keys()
        worst = max(worst, *(float((a[n] - b[n]).abs().max()) for n in a))
    return worst
