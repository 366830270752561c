"""The model's source files are read and hashed only where a key needs them (``store=``,
``artifacts=``, a job's shared entries, a whole-model build), never by a plain compile."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchkiln
import torchkiln.artifacts.directory as artifact_directory
import torchkiln.examples
from torchkiln.configuration.config import CompileConfig
from torchkiln.jobs.whole_store import whole_key

_watched: dict[str, int] = {}
"""Source file -> how often it was opened, for the files a test watches."""


def _count_opens(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and isinstance(args[0], str) and args[0] in _watched:
        _watched[args[0]] += 1


sys.addaudithook(_count_opens)  # for the process; it counts only the files in _watched

MARKER_SOURCE = '''
from torch import nn

class Marker(nn.Module):
    """Never called: its file is read only by whoever reads every class's source file."""
'''


@pytest.fixture
def marked_llama(tmp_path: Path) -> Iterator[tuple[nn.Module, str]]:
    """A default Llama carrying a submodule whose class is defined in a file of its own, which
    nothing but source hashing opens (Dynamo never traces it); and that file's path."""
    path = tmp_path / "hashing_marker.py"
    path.write_text(MARKER_SOURCE)
    spec = importlib.util.spec_from_file_location("hashing_marker", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hashing_marker"] = module  # inspect.getsourcefile looks the class's module up
    spec.loader.exec_module(module)
    model = torchkiln.examples.llama(depth=2)
    model.marker = module.Marker()
    _watched[str(path)] = 0
    yield model, str(path)
    del _watched[str(path)], sys.modules["hashing_marker"]


def _compile_and_call(model: nn.Module, monkeypatch: pytest.MonkeyPatch, **options: Any) -> int:
    """Compile and call ``model``; returns how often ``hash_files`` ran meanwhile."""
    calls = []
    hash_files = artifact_directory.hash_files
    monkeypatch.setattr(
        artifact_directory, "hash_files", lambda *a: calls.append(a) or hash_files(*a)
    )
    torchkiln.compile(model, backend="eager", **options)
    try:
        model(torch.randint(0, 100, (1, 8)))
    finally:
        torchkiln.decompile(model)
    return len(calls)


def test_a_plain_compile_reads_no_source_file(
    marked_llama: tuple[nn.Module, str], monkeypatch: pytest.MonkeyPatch, reset_dynamo: None
) -> None:
    model, marker_file = marked_llama
    assert _compile_and_call(model, monkeypatch) == 0
    assert _watched[marker_file] == 0


def test_a_store_key_still_holds_the_source_hash(
    marked_llama: tuple[nn.Module, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    reset_dynamo: None,
) -> None:
    model, marker_file = marked_llama
    assert _compile_and_call(model, monkeypatch, store=str(tmp_path / "store")) >= 1
    assert _watched[marker_file] >= 1  # the witness: the file itself was opened and read


def test_the_whole_model_key_changes_with_a_source_file(
    marked_llama: tuple[nn.Module, str], tmp_path: Path
) -> None:
    model, marker_file = marked_llama
    config = CompileConfig(backend="eager", store=str(tmp_path / "store"))
    before = whole_key(config, model, ["model.layers.0", "model.layers.1"])
    Path(marker_file).write_text(MARKER_SOURCE + "# a helper changed\n")
    assert whole_key(config, model, ["model.layers.0", "model.layers.1"]) != before
