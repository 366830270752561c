"""A precompiled directory is code: every file torchkiln reads from it is confined to its entry,
a plain regular file of the recorded size, and hashed in the entry's ``meta.json``, all checked
before anything is unpickled (issue 23, C2, U1, D4, W2). A directory that fails the check warns
and compiles normally (an :class:`ArtifactError` under ``artifacts_strict``), never blames a
plugin."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from precompile_models import inputs, stack

import torchkiln
from torchkiln.artifacts.directory import (
    META,
    ArtifactError,
    KernelFile,
    entry_path,
    read_entry,
    read_meta,
    stored_file,
)
from torchkiln.artifacts.precompiled import ArtifactWarning, copy_kernels
from torchkiln.jobs.entry import ENTRY


class Planted:
    """A pickle that, when loaded, writes the file it names: proof that it ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (Path(self.marker), "ran"))


@pytest.fixture
def copy(artifacts: Path, tmp_path: Path) -> Path:
    """A private copy of the module's precompiled directory, to tamper with."""
    target = tmp_path / "artifacts"
    shutil.copytree(artifacts, target)
    return target


def _entries(directory: Path) -> list[Path]:
    return sorted(p for p in (directory / "entries").iterdir() if not p.name.startswith("."))


def _meta(entry: Path) -> dict[str, Any]:
    return dict(json.loads((entry / META).read_text()))


def _write_meta(entry: Path, data: dict[str, Any]) -> None:
    (entry / META).write_text(json.dumps(data))


def _compile(directory: Path, **options: Any) -> torch.nn.Module:
    return torchkiln.compile(
        stack(), backend="aot_eager", artifacts=str(directory), progress="off", **options
    )


def _runs_normally(model: torch.nn.Module) -> None:
    with torch.no_grad():
        torch.testing.assert_close(model(inputs()), stack()(inputs()))


# --- end to end: tampering warns and compiles normally, strict raises --------------------------


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_planted_pickle_never_runs_and_is_called_tampered(copy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for entry in _entries(copy):
        (entry / ENTRY).write_bytes(pickle.dumps(Planted(marker)))
    with pytest.warns(ArtifactWarning, match=r"'entry\.bin' does not match .*tampered"):
        model = _compile(copy)
    assert not marker.exists()
    _runs_normally(model)
    with pytest.raises(ArtifactError, match="does not match"):
        _compile(copy, artifacts_strict=True)
    assert not marker.exists()


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_truncated_entry_is_refused(copy: Path) -> None:
    entry = _entries(copy)[0] / ENTRY
    entry.write_bytes(entry.read_bytes()[:100])
    with pytest.warns(ArtifactWarning, match=r"100 bytes, the manifest says \d+"):
        _runs_normally(_compile(copy))


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_same_size_change_is_caught_by_the_hash(copy: Path) -> None:
    entry = _entries(copy)[0] / ENTRY
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    with pytest.warns(ArtifactWarning, match="SHA-256 differs"):
        _runs_normally(_compile(copy))


@pytest.mark.needs_feature("precompiled artifacts")
@pytest.mark.parametrize("where", ["absolute", "dotdot"])
def test_an_entry_outside_the_directory_is_refused_even_with_its_hash(
    copy: Path, tmp_path: Path, where: str
) -> None:
    """The file outside has the right bytes and hash: only confinement refuses it."""
    entry = _entries(copy)[0]
    data = _meta(entry)
    outside = tmp_path / "outside.bin"
    shutil.copy(entry / ENTRY, outside)
    data["entry"]["file"] = str(outside) if where == "absolute" else "../../../outside.bin"
    _write_meta(entry, data)
    with pytest.warns(ArtifactWarning, match="points outside the artifact directory"):
        _runs_normally(_compile(copy))


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_deep_meta_warns_and_compiles_normally(copy: Path) -> None:
    (_entries(copy)[0] / META).write_text("[" * 100_000)
    with pytest.warns(ArtifactWarning, match="nested too deeply"):
        _runs_normally(_compile(copy))
    with pytest.raises(ArtifactError, match="nested too deeply") as raised:
        _compile(copy, artifacts_strict=True)
    assert not isinstance(raised.value, torchkiln.PluginError)


def _kernels(directory: Path) -> list[tuple[Path, str]]:
    """Every entry's kernel files: (entry, file relative to it)."""
    return [(e, k["file"]) for e in _entries(directory) for k in _meta(e)["kernels"]]


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_tampered_kernel_is_refused_before_it_reaches_the_cache(
    copy: Path, tmp_path: Path
) -> None:
    entry, kernel = _kernels(copy)[0]
    (entry / kernel).write_bytes(b"planted")
    cache = tmp_path / "cache"
    with pytest.warns(ArtifactWarning, match=rf"{kernel}' does not match"):
        model = _compile(copy, cache_dir=str(cache))
    _runs_normally(model)
    torchkiln.decompile(model)  # gives the cache directory setting back
    assert not list(cache.rglob(Path(kernel).name))


@pytest.mark.needs_feature("precompiled artifacts")
def test_kernels_go_to_the_models_own_cache_dir(
    copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W2: with artifacts= and cache_dir=, the kernels land in the chosen directory."""
    previous, chosen = tmp_path / "previous", tmp_path / "chosen"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(previous))
    kernels = [kernel for _, kernel in _kernels(copy)]
    assert kernels
    model = _compile(copy, cache_dir=str(chosen))
    _runs_normally(model)
    for kernel in kernels:
        relative = Path(kernel).relative_to("kernels")
        assert (chosen / relative).is_file() and not (previous / relative).exists()
    torchkiln.decompile(model)


# --- read_entry: the one check ------------------------------------------------------------------


def _entry(directory: Path, name: str, data: bytes) -> KernelFile:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return stored_file(directory, name)


def test_read_entry_returns_checked_bytes(tmp_path: Path) -> None:
    entry = _entry(tmp_path, "groups/a.bin", b"payload")
    assert read_entry(tmp_path, entry) == b"payload"


def test_read_entry_refuses_links_even_inside_the_directory(tmp_path: Path) -> None:
    entry = _entry(tmp_path, "groups/a.bin", b"payload")
    (tmp_path / "groups" / "link.bin").symlink_to(tmp_path / "groups" / "a.bin")
    with pytest.raises(ArtifactError, match=r"'groups/link\.bin' is or passes through a link"):
        read_entry(tmp_path, KernelFile("groups/link.bin", entry.size, entry.sha256))
    (tmp_path / "linked").symlink_to(tmp_path / "groups")
    with pytest.raises(ArtifactError, match="passes through a link"):
        read_entry(tmp_path, KernelFile("linked/a.bin", entry.size, entry.sha256))


def test_read_entry_never_reads_dev_zero_or_a_fifo(tmp_path: Path) -> None:
    entry = _entry(tmp_path, "groups/a.bin", b"payload")
    with pytest.raises(ArtifactError, match="outside"):
        read_entry(tmp_path, KernelFile("/dev/zero", entry.size, entry.sha256))
    (tmp_path / "groups" / "zero.bin").symlink_to("/dev/zero")
    with pytest.raises(ArtifactError, match="link"):
        read_entry(tmp_path, KernelFile("groups/zero.bin", entry.size, entry.sha256))
    os.mkfifo(tmp_path / "groups" / "fifo.bin")
    with pytest.raises(ArtifactError, match=r"'groups/fifo\.bin' is not a regular file"):
        read_entry(tmp_path, KernelFile("groups/fifo.bin", entry.size, entry.sha256))


def test_read_entry_refuses_a_huge_file_without_reading_it(tmp_path: Path) -> None:
    entry = _entry(tmp_path, "groups/a.bin", b"payload")
    with open(tmp_path / "groups" / "a.bin", "r+b") as handle:
        handle.truncate(64 * 2**30)  # sparse: 64 GiB that would take minutes to read
    started = time.perf_counter()
    with pytest.raises(ArtifactError, match=r"68719476736 bytes, the manifest says 7"):
        read_entry(tmp_path, entry)
    assert time.perf_counter() - started < 1.0


def test_read_entry_refuses_records_without_a_valid_hash(tmp_path: Path) -> None:
    _entry(tmp_path, "groups/a.bin", b"payload")
    for size, sha256 in [(-1, ""), (7, "0" * 63), (7, None), ("7", "0" * 64)]:
        with pytest.raises(ArtifactError, match="no valid size and sha256"):
            read_entry(tmp_path, KernelFile("groups/a.bin", size, sha256))  # type: ignore[arg-type]


def test_a_huge_or_special_meta_is_refused_unread(tmp_path: Path) -> None:
    (tmp_path / META).symlink_to("/dev/zero")
    with pytest.raises(ArtifactError, match="cannot be read"):
        read_meta(tmp_path)
    (tmp_path / META).unlink()
    with open(tmp_path / META, "wb") as handle:
        handle.truncate(2**31)
    with pytest.raises(ArtifactError, match="a manifest has at most"):
        read_meta(tmp_path)
    (tmp_path / META).write_text('{"format": 99}')
    with pytest.raises(ArtifactError, match="not a torchkiln entry of format 1"):
        read_meta(tmp_path)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(["groups", "..", ".", "", "/", "a.bin", "\\", "..\\x", "~", "kernels"]),
        min_size=1,
        max_size=6,
    )
)
def test_entry_paths_never_leave_the_directory(parts: list[str]) -> None:
    """Whatever a manifest says, the path is inside the directory or refused."""
    root = Path("/tmp/torchkiln-confined").resolve()
    relative = "/".join(parts)
    try:
        path = entry_path(root, relative)
    except ArtifactError as error:
        assert repr(relative) in str(error)
    else:
        assert path.is_relative_to(root) and path != root


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=512),
    edit=st.sampled_from(["truncate", "flip", "append", "replace"]),
    at=st.integers(min_value=0, max_value=511),
    extra=st.binary(min_size=1, max_size=64),
)
def test_any_change_to_an_entry_is_refused(data: bytes, edit: str, at: int, extra: bytes) -> None:
    """Truncated, flipped, grown or replaced: the bytes never come back."""
    root = Path(f"/tmp/torchkiln-tamper-{os.getpid()}")
    shutil.rmtree(root, ignore_errors=True)
    entry = _entry(root, "groups/e.bin", data)
    at %= len(data)
    changed = {
        "truncate": data[:at],
        "flip": data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :],
        "append": data + extra,
        "replace": extra if extra != data else extra + b"x",
    }[edit]
    (root / entry.file).write_bytes(changed)
    with pytest.raises(ArtifactError, match=r"'groups/e\.bin' does not match the manifest"):
        read_entry(root, entry)
    shutil.rmtree(root, ignore_errors=True)


# --- D4: copying kernels into a shared cache never writes through a link -----------------------


def test_copy_kernels_replaces_a_planted_link_instead_of_writing_through_it(
    tmp_path: Path,
) -> None:
    artifacts, cache, protected = tmp_path / "artifacts", tmp_path / "cache", tmp_path / "root"
    protected.mkdir()
    kernels = [
        _entry(artifacts, "kernels/fxgraph/ab/entry", b"graph"),
        _entry(artifacts, "kernels/aotautograd/cd/entry", b"aot"),
        _entry(artifacts, "kernels/kept", b"new"),
    ]
    (cache / "fxgraph" / "ab").mkdir(parents=True)
    (cache / "fxgraph" / "ab" / "entry").symlink_to(protected / "planted")  # dangling
    (cache / "aotautograd").symlink_to(protected)  # a linked directory
    (cache / "kept").write_bytes(b"old")
    copied = copy_kernels(artifacts, kernels, cache)
    assert list(protected.iterdir()) == []  # nothing was written through a link
    entry = cache / "fxgraph" / "ab" / "entry"
    assert not entry.is_symlink() and entry.read_bytes() == b"graph"
    assert (cache / "kept").read_bytes() == b"old"  # content-addressed: kept
    assert copied == 1


def test_copy_kernels_refuses_a_record_outside_kernels(tmp_path: Path) -> None:
    record = _entry(tmp_path, "groups/a.bin", b"payload")
    with pytest.raises(ArtifactError, match="not under kernels/"):
        copy_kernels(tmp_path, [record], tmp_path / "cache")


# --- the docs state one trust model -------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs"
TRUST_MODEL = "configuration.md#paths-that-are-code-the-trust-model"


def test_the_docs_state_one_trust_model() -> None:
    configuration = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert "### Paths that are code: the trust model" in configuration
    table = configuration.split("### Paths that are code")[1].split("\n\n")[2]
    for path in ("`cache_dir`", "`artifacts`", "`distributed.deepspeed.config`", "module:factory"):
        assert path in table
    for page in ("precompile.md", "cache.md"):
        text = (DOCS / page).read_text(encoding="utf-8")
        assert TRUST_MODEL in text, page
        assert "is code" in text, page
    precompile = (DOCS / "precompile.md").read_text(encoding="utf-8")
    assert "does not match the manifest" in precompile and "nothing of it was loaded" in precompile
    assert "re-run\n`torchkiln precompile`" in precompile
