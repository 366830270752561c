"""Fixtures for the transformers model tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # decoder_zoo, for the test modules here


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models on one intra-op thread: on a busy 2-core machine two threads spinning for
    each matmul made eager generate() 30x slower (measured); results are the same."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
