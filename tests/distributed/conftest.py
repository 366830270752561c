"""Fixtures for the real multi-process tests (helpers live in ``launching.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from launching import WORKER, read_ranks, torchrun


@pytest.fixture(scope="module")
def run_worker(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[dict[str, Any]]]:
    """``run_worker("ddp")`` -> each rank's measurements (cached per arguments in a module)."""
    cache: dict[tuple[str, ...], list[dict[str, Any]]] = {}

    def run(*args: str) -> list[dict[str, Any]]:
        if args not in cache:
            out_dir = tmp_path_factory.mktemp("-".join(args))
            process = torchrun(WORKER, [*args[:1], str(out_dir), *args[1:]], cwd=out_dir)
            cache[args] = read_ranks(out_dir, process)
        return cache[args]

    return run
