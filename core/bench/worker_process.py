"""One worker process (:mod:`torchkiln.bench.worker`): its command line, and running it with a
timeout while passing on what it says it is doing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchkiln.artifacts.cache import cache_dir_environment
from torchkiln.bench.results import RunFailure
from torchkiln.bench.settings import BenchSettings
from torchkiln.bench.worker import PROGRESS_PREFIX

STDERR_TAIL_LINES = 25
TICK_SECONDS = 1.0
"""How often a live (terminal) progress line is redrawn while a worker is quiet."""


def artifacts_dir(scratch: Path, strategy: str) -> Path:
    """Where ``precompiled``'s artifacts, or the whole-model form ``tiered``'s builder writes
    (and its steady-state run loads), live for one depth and batch."""
    return scratch / strategy / "artifacts"


def worker_command(
    settings: BenchSettings,
    depth: int | None,
    batch: int,
    output: Path,
    *,
    strategy: str | None = None,
    steady: tuple[str, ...] = (),
    precompile: bool = False,
    scratch: Path | None = None,
) -> list[str]:
    """``python -m torchkiln.bench.worker`` for one first-call run (``strategy``), the shared
    steady-state run of several strategies (``steady``), or writing ``precompiled``'s artifact
    directory (``precompile``); with ``scratch``, the artifact directories its strategies use."""
    command = [
        sys.executable, "-m", "torchkiln.bench.worker",
        "--model", settings.model,
        "--batch", str(batch),
        "--seq", str(settings.seq),
        "--backend", settings.backend,
        "--device", settings.device,
        "--dtype", settings.dtype,
        "--steady-iters", str(settings.steady_iters),
        "--warmup", str(settings.warmup_iters),
        "--output", str(output),
        "--spawned-at", repr(time.time()),
    ]  # fmt: skip
    if precompile:
        command.append("--precompile")
    elif strategy:
        command += ["--strategy", strategy]
        if settings.steady_in_first_call:
            command.append("--steady-here")
    else:
        command += ["--strategies", ",".join(steady)]
    strategies = steady or (("precompiled",) if precompile else (strategy,))
    if scratch is not None:
        for name, option in (("precompiled", "--artifacts"), ("tiered", "--tiered-artifacts")):
            if name in strategies:
                command += [option, str(artifacts_dir(scratch, name))]
    if settings.mode is not None:
        command += ["--mode", settings.mode]
    if depth is not None:
        command += ["--depth", str(depth)]
    if settings.train:
        command.append("--train")
    if settings.workload == "generate":
        command += ["--workload", "generate", "--new-tokens", str(settings.new_tokens)]
    return command


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-STDERR_TAIL_LINES:])


def _stream(
    command: list[str], env: dict[str, str], timeout: float, on_progress: Callable[[str], None]
) -> tuple[int | None, str]:
    """Run ``command``; pass each progress line of its stderr to ``on_progress`` as it comes
    (``""`` every :data:`TICK_SECONDS` in between). Returns the exit code (``None``: stopped
    at ``timeout``) and the rest of stderr."""
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    kept: list[str] = []
    said: list[str] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            if line.startswith(PROGRESS_PREFIX):
                said.append(line[len(PROGRESS_PREFIX) :].strip())
            else:
                kept.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    shown = 0
    try:
        while process.poll() is None and time.monotonic() < deadline:
            reader.join(TICK_SECONDS)
            new = said[shown:]
            shown += len(new)
            for text in [*new, ""]:
                on_progress(text)
    finally:  # also on Ctrl-C: never leave a worker behind
        timed_out = process.poll() is None
        if timed_out:
            process.kill()
        process.wait()
    reader.join(5.0)
    for text in said[shown:]:
        on_progress(text)
    return (None if timed_out else process.returncode), "".join(kept)


def run_worker(
    command: list[str],
    run: str,
    cache_dir: Path,
    output: Path,
    timeout: float,
    on_progress: Callable[[str], None] = lambda _text: None,
) -> tuple[dict[str, Any] | None, RunFailure | None]:
    """One worker process with ``cache_dir`` as its inductor cache; returns its JSON or why
    there is none. ``on_progress`` gets what the worker says it is doing."""
    output.unlink(missing_ok=True)
    env = dict(os.environ) | cache_dir_environment(cache_dir)
    code, stderr = _stream(command, env, timeout, on_progress)
    if code is None:
        return None, RunFailure(
            run, None, f"stopped after {timeout:.0f} s (--timeout)", _tail(stderr)
        )
    if code != 0 or not output.exists():
        last = _tail(stderr).splitlines()[-1:] or ["(no output)"]
        message = f"worker exited with code {code}: {last[0]}"
        return None, RunFailure(run, code, message, _tail(stderr))
    return json.loads(output.read_text(encoding="utf-8")), None
